package idem_test

// Attempt.Fence counts the attempts that may have acted. An attempt that
// called Release said that it did nothing: the next one keeps its fence. An
// attempt whose function failed may have acted before failing: the next one
// gets the fence above it.

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestFenceCountsAttemptsThatMayHaveActed: through Do and the middleware, a
// released attempt leaves the next attempt at Fence 1; a failed one (fn's
// error, the handler's 500) makes it Fence 2.
func TestFenceCountsAttemptsThatMayHaveActed(t *testing.T) {
	cases := []struct {
		name  string
		first func(a *idem.Attempt) error // the first attempt's end: nil after Release, else its failure
		want  int64                       // the second attempt's fence
	}{
		{name: "released", first: func(a *idem.Attempt) error { a.Release(); return nil }, want: 1},
		{name: "failed", first: func(*idem.Attempt) error { return errors.New("charge declined by a timeout") }, want: 2},
	}
	for _, tc := range cases {
		t.Run("Do/"+tc.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b *backend) {
				g := b.guard(t)
				var fences []int64
				fn := func(ctx context.Context, a *idem.Attempt) (int64, error) {
					fences = append(fences, a.Fence)
					if len(fences) == 1 {
						return 0, tc.first(a)
					}
					return a.Fence, nil
				}
				ctx := context.Background()
				_, _ = idem.Do(ctx, g, "k", payment{Amount: 1}, fn)
				v, err := idem.Do(ctx, g, "k", payment{Amount: 1}, fn)
				require.NoError(t, err)
				require.Equal(t, tc.want, v)
				require.Equal(t, []int64{1, tc.want}, fences)
			})
		})
		t.Run("Middleware/"+tc.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b *backend) {
				g := b.guard(t)
				var fences []int64
				h := g.Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					a, _ := idem.AttemptFrom(r.Context())
					fences = append(fences, a.Fence)
					if len(fences) == 1 {
						if err := tc.first(a); err != nil {
							http.Error(w, err.Error(), http.StatusInternalServerError)
							return
						}
						http.Error(w, "upstream unreachable", http.StatusBadGateway)
						return
					}
					w.WriteHeader(http.StatusCreated)
					_, _ = w.Write([]byte(strconv.FormatInt(a.Fence, 10)))
				}))
				q := req{key: "k", body: `{"amount":1}`}
				require.GreaterOrEqual(t, serve(h, q).Code, 500)
				rec := serve(h, q)
				require.Equal(t, http.StatusCreated, rec.Code)
				require.Equal(t, strconv.FormatInt(tc.want, 10), rec.Body.String())
				require.Equal(t, []int64{1, tc.want}, fences)
			})
		})
	}
}
