//go:build unix

package idem_test

// Orphaned claims: a claim sent to a Redis that did not answer, which Redis
// runs once it answers again, is taken back by its owner, and does not count
// as an attempt. The retry the refusal invited runs at once, as attempt 1,
// through Do, Once and the middleware.

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/redistest"
)

// TestOrphanedClaimReleased: a claim sent to a Redis that did not answer is
// released by its owner once Redis answers again, and does not count as an
// attempt. The refused key's retry runs at once: never ErrInProgress (409),
// the function runs exactly once, as attempt 1; a repeat then replays it.
// The retries are sent until one is not refused, since fail-fast may still
// be probing the store when the first is sent.
func TestOrphanedClaimReleased(t *testing.T) {
	for _, e := range sickEntries {
		for _, fault := range sickFaults {
			for _, c := range sickClients {
				t.Run(e.name+"/"+fault+"/"+c.name, func(t *testing.T) {
					s := startSick(t, fault)
					g := s.guard(c.ctxTimeout)
					warm(t, e, g)
					s.freeze()
					o, took := timed(func() sickOutcome { return e.call(t, g, "orphan-1") })
					t.Logf("refused after %v", took.Round(time.Millisecond))
					require.ErrorIs(t, o.err, idem.ErrStoreUnavailable)
					require.False(t, o.ran)

					back := s.resume()
					o, refused := retryServed(t, e, g, "orphan-1")
					t.Logf("served %v after Redis answered, %d retries refused first", time.Since(back).Round(time.Millisecond), refused)
					require.NoError(t, o.err, "the retry after recovery (%d refused before it)", refused)
					require.True(t, o.ran, "the retry runs the function")
					if e.name != "Once" {
						require.EqualValues(t, 1, o.fence, "the released orphan did not count as an attempt")
					}
					o, _ = retryServed(t, e, g, "orphan-1") // a loaded machine may miss a 200 ms budget
					require.NoError(t, o.err)
					require.False(t, o.ran, "the function ran once")
					require.True(t, o.replayed)
				})
			}
		}
	}
}

// retryServed sends key through e until the request is not refused with
// ErrStoreUnavailable, for at most sickRecovery, and returns what the first
// such request got and how many were refused before it. It fails the test
// at once on ErrInProgress: the key is held by a claim nobody runs.
func retryServed(t *testing.T, e sickEntry, g *idem.Guard, key string) (sickOutcome, int) {
	t.Helper()
	deadline := time.Now().Add(sickRecovery)
	for refused := 0; ; refused++ {
		o := e.call(t, g, key)
		require.False(t, errors.Is(o.err, idem.ErrInProgress),
			"retry %d of %s got ErrInProgress (409): the refused request's claim holds the key", refused+1, key)
		if !errors.Is(o.err, idem.ErrStoreUnavailable) || errors.Is(o.err, idem.ErrNotRecorded) {
			return o, refused
		}
		require.False(t, o.ran)
		require.True(t, time.Now().Before(deadline), "%s still refused %v after Redis answered: %v", key, sickRecovery, o.err)
		time.Sleep(10 * time.Millisecond) // a client's pause between retries
	}
}

// TestTakeBackWithoutUnclaimer: behind a store that cannot take a claim
// back (a wrapper that passes on idemstore.Store's methods only), the claim
// whose answer never came is released instead; a release the store answers
// ends it, whatever it answers (no claim of that owner: nothing came). The
// retry of the refused key then runs at once, rather than being refused
// until the lease ends.
func TestTakeBackWithoutUnclaimer(t *testing.T) {
	for name, store := range map[string]func() idemstore.Store{
		"memory": func() idemstore.Store { return idemtest.NewMemoryStore() },
		"redis-server": func() idemstore.Store {
			return idem.NewRedisStore(redistest.Shared(t).Client(t), idem.WithPrefix(redistest.Prefix(t)))
		},
	} {
		t.Run(name, func(t *testing.T) {
			st := &downStore{Store: store()}
			g := idem.New(st, quiet)
			st.down.Store(true)
			_, err := idem.Do(context.Background(), g, "k", nil, okFn("charged"))
			require.ErrorIs(t, err, idem.ErrStoreUnavailable)
			st.down.Store(false)

			v, err := idem.Do(context.Background(), g, "k", nil, okFn("charged"))
			require.NoError(t, err, "the retry runs once the store answers")
			require.Equal(t, "charged", v)
			require.NoError(t, g.Drain(context.Background()))
		})
	}
}

// downStore refuses every claim, as an unreachable Redis does, while down
// is set. It has idemstore.Store's methods only.
type downStore struct {
	idemstore.Store
	down atomic.Bool
}

func (s *downStore) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	if s.down.Load() {
		return idemstore.ClaimResult{}, errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	}
	return s.Store.Claim(ctx, id, c)
}
