package idem_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestReleaseMiddleware: a handler that releases its attempt answers with
// its own response, unstored even when WithCacheStatus stores its status,
// and the next request with the key runs at once, with the same fence: an
// attempt that did nothing is not counted.
func TestReleaseMiddleware(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		obs := &recObserver{}
		g := b.guard(t, idem.WithLease(time.Minute), idem.WithObserver(obs))
		var fences []int64
		mw := g.Middleware(idem.WithCacheStatus(func(int) bool { return true }))
		post := firstAttemptFails(t, mw, "released-1", &fences, (*idem.Attempt).Release)
		w := post()
		require.Equal(t, http.StatusBadGateway, w.Code)
		require.Equal(t, idem.OutcomeReleased, obs.last(t).Outcome)
		w = post()
		require.Equal(t, http.StatusOK, w.Code, "the released key runs again at once")
		require.Empty(t, w.Header().Get("Idempotent-Replayed"))
		w = post()
		require.Equal(t, "true", w.Header().Get("Idempotent-Replayed"))
		require.Equal(t, "done", w.Body.String())
		require.Equal(t, []int64{1, 1}, fences)
	})
}

// TestReleaseDo: under Do, a released attempt's value is returned but not
// stored; the next call runs again, with the same fence (the released
// attempt did nothing), and its result is stored.
func TestReleaseDo(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t)
		runs := 0
		var fences []int64
		fn := func(ctx context.Context, a *idem.Attempt) (int, error) {
			runs++
			fences = append(fences, a.Fence)
			if runs == 1 {
				a.Release()
			}
			return runs, nil
		}
		for _, want := range []int{1, 2, 2} {
			got, err := idem.Do(context.Background(), g, "k", payment{Amount: 1}, fn)
			require.NoError(t, err)
			require.Equal(t, want, got)
		}
		require.Equal(t, 2, runs)
		require.Equal(t, []int64{1, 1}, fences)
	})
}

// TestAbandonWinsOverRelease: an attempt that called both keeps its claim.
func TestAbandonWinsOverRelease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t, idem.WithLease(time.Minute))
		fn := func(ctx context.Context, a *idem.Attempt) (int, error) {
			a.Release()
			a.Abandon()
			return 1, nil
		}
		_, err := idem.Do(context.Background(), g, "k", payment{Amount: 1}, fn)
		require.NoError(t, err)
		_, err = idem.Do(context.Background(), g, "k", payment{Amount: 1}, fn)
		require.ErrorIs(t, err, idem.ErrInProgress)
	})
}

// TestAbandonThenPanic: a handler that abandons its attempt and then panics
// (a reverse proxy aborting a response its upstream broke off) keeps the
// claim: the panic does not release the key.
func TestAbandonThenPanic(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		obs := &recObserver{}
		g := b.guard(t, idem.WithLease(time.Minute), idem.WithObserver(obs))
		runs := 0
		h := g.Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			a, _ := idem.AttemptFrom(r.Context())
			a.Abandon()
			panic(http.ErrAbortHandler)
		}))
		post := func() (w *httptest.ResponseRecorder, panicked any) {
			defer func() { panicked = recover() }()
			r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`))
			r.Header.Set("Idempotency-Key", "abandoned-panic")
			w = httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w, nil
		}
		_, p := post()
		require.True(t, errors.Is(p.(error), http.ErrAbortHandler), "the panic continues")
		require.Equal(t, idem.OutcomeAbandoned, obs.last(t).Outcome)
		w, p := post()
		require.Nil(t, p)
		require.Equal(t, http.StatusConflict, w.Code, "the abandoned claim holds the key")
		require.Equal(t, 1, runs)
	})
}

// TestReleaseNil: Release on a nil Attempt does nothing.
func TestReleaseNil(t *testing.T) {
	var a *idem.Attempt
	require.NotPanics(t, a.Release)
}
