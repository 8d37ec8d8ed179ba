package idemtest_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/redistest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	redistest.StopShared()
	os.Exit(code)
}

func TestMemoryStoreContract(t *testing.T) {
	idemtest.Run(t, idemtest.Harness{
		New: func(t *testing.T) (idemstore.Store, func(time.Duration)) {
			s := idemtest.NewMemoryStore()
			return s, s.Advance
		},
	})
}

func TestMemoryStoreExpiry(t *testing.T) {
	ctx := context.Background()
	s := idemtest.NewMemoryStore()
	g := idem.New(s, idem.WithRetention(time.Hour))
	runs := 0
	do := func() {
		_, err := idem.Do(ctx, g, "k", "req", func(ctx context.Context, a *idem.Attempt) (int, error) {
			runs++
			return runs, nil
		})
		require.NoError(t, err)
	}
	do()
	do()
	require.Equal(t, 1, runs, "a repeat within the retention replays")
	rec, err := s.Read(ctx, idem.OperationID(idem.KindDo, "", "k"))
	require.NoError(t, err)
	require.Equal(t, idemstore.StateCompleted, rec.State)
	require.InDelta(t, time.Hour, rec.TTL, float64(time.Second))
	s.Advance(time.Hour)
	do()
	require.Equal(t, 2, runs, "after the retention the key is new")
}

func TestMemoryStoreAdvanceTakesLeases(t *testing.T) {
	ctx := context.Background()
	s := idemtest.NewMemoryStore()
	const lease = 300 * time.Millisecond
	g := idem.New(s, idem.WithLease(lease))
	started, lost := make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := idem.Do(ctx, g, "k", "req", func(ctx context.Context, a *idem.Attempt) (int, error) {
			close(started)
			<-ctx.Done()
			return 0, context.Cause(ctx)
		})
		lost <- err
	}()
	<-started
	_, err := idem.Do(ctx, g, "k", "req", func(ctx context.Context, a *idem.Attempt) (int, error) { return 0, nil })
	require.ErrorIs(t, err, idem.ErrInProgress)
	s.Advance(2 * lease) // the holder "froze" past its lease
	fence, err := idem.Do(ctx, g, "k", "req", func(ctx context.Context, a *idem.Attempt) (int64, error) { return a.Fence, nil })
	require.NoError(t, err)
	require.Equal(t, int64(2), fence, "the next attempt takes over")
	select { // its next heartbeat finds the lease taken
	case err := <-lost:
		require.ErrorIs(t, err, idem.ErrLeaseLost)
	case <-time.After(10 * time.Second):
		t.Fatal("the holder never learnt that it lost its lease")
	}
}

func TestNewAttemptGuard(t *testing.T) {
	ctx := context.Background()
	g := idemtest.NewAttemptGuard(3, map[string][]byte{"charge_id": []byte("ch_1")})
	var seen []int64
	charge := func(ctx context.Context, a *idem.Attempt) (string, error) {
		seen = append(seen, a.Fence)
		if string(a.Checkpoints()["charge_id"]) != "ch_1" {
			return "", errors.New("checkpoint missing")
		}
		if len(seen) == 1 {
			require.NoError(t, a.Checkpoint(ctx, "charge_id", []byte("ch_1")))
			return "", errors.New("provider timeout") // released: the next call runs again
		}
		return "reconciled", nil
	}
	_, err := idem.Do(ctx, g, "k", "req", charge)
	require.EqualError(t, err, "provider timeout")
	got, err := idem.Do(ctx, g, "k", "req", charge)
	require.NoError(t, err)
	require.Equal(t, "reconciled", got)
	require.Equal(t, []int64{3, 4}, seen, "the first run is attempt 3, a re-run attempt 4")
	got, err = idem.Do(ctx, g, "k", "req", charge)
	require.NoError(t, err)
	require.Equal(t, "reconciled", got, "replays are the store's own")
	require.Len(t, seen, 2)
}

func TestAsAttemptOnRedis(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Shared(t)
	g := idem.New(idemtest.AsAttempt(idem.NewRedisStore(srv.Client(t), idem.WithPrefix(redistest.Prefix(t))), 2,
		map[string][]byte{"a": []byte("earlier"), "b": []byte("earlier")}))
	got, err := idem.Do(ctx, g, "k", "req", func(ctx context.Context, a *idem.Attempt) (map[string]string, error) {
		require.NoError(t, a.Checkpoint(ctx, "b", []byte("mine")))
		cps := a.Checkpoints()
		return map[string]string{"fence": string(rune('0' + a.Fence)), "a": string(cps["a"]), "b": string(cps["b"])}, nil
	})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"fence": "2", "a": "earlier", "b": "mine"}, got)
}

func TestAsAttemptHandler(t *testing.T) {
	g := idemtest.NewAttemptGuard(2, map[string][]byte{"charge_id": []byte("ch_1")})
	h := g.Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, ok := idem.AttemptFrom(r.Context())
		if !ok {
			http.Error(w, "no attempt", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(string(rune('0'+a.Fence)) + " " + string(a.Checkpoints()["charge_id"])))
	}))
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":1}`))
	r.Header.Set("Idempotency-Key", "k1")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	require.Equal(t, http.StatusCreated, w.Code)
	require.Equal(t, "2 ch_1", w.Body.String())
}

func TestAttemptFromOutsideTheMiddleware(t *testing.T) {
	a, ok := idem.AttemptFrom(context.Background())
	require.False(t, ok)
	require.Nil(t, a)
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	a, ok = idem.AttemptFrom(r.Context())
	require.False(t, ok)
	require.Nil(t, a)
}

func TestParallel(t *testing.T) {
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(50 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("paid"))
	})
	newReq := func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":1}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", idemclient.NewKey())
		return r
	}
	tests := []struct {
		name     string
		opts     []idem.Option
		statuses map[int]int
		replayed int
	}{
		{"without wait, duplicates get 409", nil, map[int]int{http.StatusCreated: 1, http.StatusConflict: 15}, 0},
		{"with wait, duplicates get the first response", []idem.Option{idem.WithWait(5 * time.Second)}, map[int]int{http.StatusCreated: 16}, 15},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := idemtest.NewGuard(tt.opts...)
			r := newReq()
			res := idemtest.Parallel(16, r, g.Middleware(), slow)
			require.Equal(t, 1, res.Ran)
			require.Equal(t, tt.statuses, res.Statuses)
			require.Equal(t, tt.replayed, res.Replayed)
			require.Len(t, res.Responses, 16)
			require.Empty(t, res.Panics)

			// r is reusable: a later repeat replays.
			again := idemtest.Parallel(2, r, g.Middleware(), slow)
			require.Zero(t, again.Ran)
			require.Equal(t, map[int]int{http.StatusCreated: 2}, again.Statuses)
		})
	}
}

func TestParallelWithoutMiddlewareRunsEveryCopy(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader("x"))
	none := func(h http.Handler) http.Handler { return h }
	res := idemtest.Parallel(8, r, none, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	require.Equal(t, 8, res.Ran, "the helper counts every run: without protection, 8 side effects")
	require.Zero(t, idemtest.Parallel(0, r, none, http.NotFoundHandler()).Ran)
}

func TestParallelPanics(t *testing.T) {
	g := idemtest.NewGuard()
	r := httptest.NewRequest(http.MethodPost, "/payments", nil)
	r.Header.Set("Idempotency-Key", "k")
	res := idemtest.Parallel(1, r, g.Middleware(), http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	require.Equal(t, []any{"boom"}, res.Panics)
	require.Equal(t, map[int]int{http.StatusInternalServerError: 1}, res.Statuses)
}
