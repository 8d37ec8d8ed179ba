package idem_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestAbandon: an attempt whose outcome is not known keeps its claim until
// the lease runs out: no repeat runs meanwhile, and the first one after
// takes over as attempt 2 with the checkpoints.
func TestAbandon(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		const lease = time.Second
		obs := &recObserver{}
		g := b.guard(t, idem.WithLease(lease), idem.WithObserver(obs))
		ctx := context.Background()
		sent := errors.New("upstream: connection reset after the request was sent")
		var runs atomic.Int32
		fn := func(ctx context.Context, a *idem.Attempt) (string, error) {
			runs.Add(1)
			if a.Fence == 1 {
				require.NoError(t, a.Checkpoint(ctx, "sent", []byte("charge-1")))
				a.Abandon()
				return "", sent
			}
			return "reconciled " + string(a.Checkpoints()["sent"]), nil
		}
		_, err := idem.Do(ctx, g, "k", payment{Amount: 1}, fn)
		require.ErrorIs(t, err, sent, "Do returns fn's own error")
		require.NotErrorIs(t, err, idem.ErrNotRecorded)
		e := obs.last(t)
		require.Equal(t, idem.OutcomeAbandoned, e.Outcome)
		require.Positive(t, e.Store)
		require.LessOrEqual(t, e.Store, e.Duration, "the store's share of the call")
		require.EqualValues(t, 1, e.Fence)

		_, err = idem.Do(ctx, g, "k", payment{Amount: 1}, fn)
		var ip *idem.InProgressError
		require.ErrorAs(t, err, &ip, "the abandoned claim holds the key until its lease runs out")
		require.Equal(t, idem.OutcomeInProgress, obs.last(t).Outcome)
		require.Positive(t, ip.RetryAfter)
		require.LessOrEqual(t, ip.RetryAfter, lease)
		require.EqualValues(t, 1, runs.Load())

		b.advance(lease + lease/2)
		got, err := idem.Do(ctx, g, "k", payment{Amount: 1}, fn)
		require.NoError(t, err)
		require.Equal(t, "reconciled charge-1", got, "attempt 2 sees the abandoned attempt's checkpoint")
		require.EqualValues(t, 2, runs.Load())
		e = obs.last(t)
		require.Equal(t, idem.OutcomeExecuted, e.Outcome)
		require.EqualValues(t, 2, e.Fence)
		got, err = idem.Do(ctx, g, "k", payment{Amount: 1}, fn)
		require.NoError(t, err)
		require.Equal(t, "reconciled charge-1", got)
		require.EqualValues(t, 2, runs.Load())
	})
}

// TestAbandonMiddleware: a handler that abandons its attempt answers with
// its own response, unstored; repeats get 409 until the lease runs out, then
// the handler runs as attempt 2.
func TestAbandonMiddleware(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		const lease = time.Second
		g := b.guard(t, idem.WithLease(lease))
		var fences []int64
		post := firstAttemptFails(t, g.Middleware(), "abandoned-1", &fences, (*idem.Attempt).Abandon)
		w := post()
		require.Equal(t, http.StatusBadGateway, w.Code)
		require.Empty(t, w.Header().Get("Idempotent-Replayed"))
		w = post()
		require.Equal(t, http.StatusConflict, w.Code, "the key is in progress until the lease runs out")
		require.NotEmpty(t, w.Header().Get("Retry-After"))
		b.advance(lease + lease/2)
		w = post()
		require.Equal(t, http.StatusOK, w.Code)
		require.Equal(t, "done", w.Body.String())
		w = post()
		require.Equal(t, "true", w.Header().Get("Idempotent-Replayed"))
		require.Equal(t, []int64{1, 2}, fences)
	})
}

// TestAbandonNil: Abandon on a nil Attempt does nothing.
func TestAbandonNil(t *testing.T) {
	var a *idem.Attempt
	require.NotPanics(t, a.Abandon)
}

// firstAttemptFails serves POST /pay with key through mw: the first attempt
// calls mark on its Attempt and answers 502, later ones answer "done"; every
// attempt's fence is appended to fences. It returns a function sending one
// request.
func firstAttemptFails(t *testing.T, mw func(http.Handler) http.Handler, key string, fences *[]int64, mark func(*idem.Attempt)) func() *httptest.ResponseRecorder {
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, ok := idem.AttemptFrom(r.Context())
		require.True(t, ok)
		*fences = append(*fences, a.Fence)
		if len(*fences) == 1 {
			mark(a)
			http.Error(w, "upstream failed", http.StatusBadGateway)
			return
		}
		io.WriteString(w, "done")
	}))
	return func() *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":1}`))
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
}
