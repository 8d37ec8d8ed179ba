//go:build unix

package idem_test

// Fail fast: once a store's calls keep failing, a Guard refuses new requests
// at once instead of each waiting the store budget, says so in StoreState,
// and serves again soon after Redis answers: after a freeze (SIGSTOP), and
// after Redis was killed and restarted on its port.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

const (
	// failFastAfter is how many refused requests may pass before the Guard
	// refuses at once ("a few"), and failFastWithin how long they may take
	// together: a hang guard.
	failFastAfter  = 10
	failFastWithin = 15 * time.Second
	// fastRefusal bounds the median of refusals once the store is known to
	// be failing: no store call, no dial.
	fastRefusal = 50 * time.Millisecond
	// serviceBack bounds the time from Redis answering again to the first
	// request served: one probe at a time tests the store, and service
	// resumes within half a second.
	serviceBack = 500 * time.Millisecond
)

// TestFailFast: with Redis frozen or killed, after a few refusals the
// Guard's StoreState is StoreFailing and 20 more requests are refused with
// ErrStoreUnavailable at once (median under 50 ms), their functions not run;
// once Redis answers again (resumed, or restarted on its port), a request is
// served within 500 ms and StoreState is StoreOK.
func TestFailFast(t *testing.T) {
	faults := []struct {
		name          string
		down, recover func(t *testing.T, s *sickRedis) time.Time // recover returns when Redis answered
	}{
		{
			name:    "frozen",
			down:    func(t *testing.T, s *sickRedis) time.Time { s.freeze(); return time.Now() },
			recover: func(t *testing.T, s *sickRedis) time.Time { return s.resume() },
		},
		{
			name:    "killed",
			down:    func(t *testing.T, s *sickRedis) time.Time { s.srv.Kill(t); return time.Now() },
			recover: func(t *testing.T, s *sickRedis) time.Time { s.srv.Restart(t); return answering(t, s.addr()) },
		},
	}
	for _, f := range faults {
		for _, c := range sickClients {
			t.Run(f.name+"/"+c.name, func(t *testing.T) {
				s := startSick(t, "SIGSTOP")
				g := s.guard(c.ctxTimeout)
				do, runs := timedDo(g)
				_, err := do("warm")
				require.NoError(t, err)
				require.Equal(t, idem.StoreOK, g.StoreState())

				f.down(t, s)
				var first []time.Duration
				start := time.Now()
				for i := 0; g.StoreState() != idem.StoreFailing; i++ {
					require.Less(t, i, failFastAfter, "still %q after %d refusals %v", g.StoreState(), i, first)
					require.Less(t, time.Since(start), failFastWithin, "still %q after %d refusals %v", g.StoreState(), i, first)
					took, err := do(fmt.Sprintf("before-%d", i))
					require.ErrorIs(t, err, idem.ErrStoreUnavailable)
					first = append(first, took.Round(time.Millisecond))
				}
				t.Logf("failing after %d refusals: %v", len(first), first)

				refusals := make([]time.Duration, 20)
				for i := range refusals {
					took, err := do(fmt.Sprintf("refused-%d", i))
					require.ErrorIs(t, err, idem.ErrStoreUnavailable)
					require.NotErrorIs(t, err, idem.ErrNotRecorded)
					refusals[i] = took
				}
				slices.Sort(refusals)
				t.Logf("20 refusals: median %v, max %v", refusals[10], refusals[19])
				require.Less(t, refusals[10], fastRefusal, "refused at once once failing")
				require.Equal(t, idem.StoreFailing, g.StoreState())
				require.Equal(t, 1, runs(), "only the warm-up ran")

				back := f.recover(t, s)
				served := servedAgain(t, do)
				t.Logf("served %v after Redis answered", served.Sub(back).Round(time.Millisecond))
				require.Less(t, served.Sub(back), serviceBack, "service resumes soon after Redis answers")
				require.Equal(t, idem.StoreOK, g.StoreState())
				require.Equal(t, 2, runs())
			})
		}
	}
}

// timedDo returns a function that sends one Do with key through g and
// returns how long it took, and a count of the runs of its function.
func timedDo(g *idem.Guard) (do func(key string) (time.Duration, error), runs func() int) {
	ran := 0
	do = func(key string) (time.Duration, error) {
		start := time.Now()
		_, err := idem.Do(context.Background(), g, key, payment{Amount: 1}, func(context.Context, *idem.Attempt) (string, error) {
			ran++
			return "v", nil
		})
		return time.Since(start), err
	}
	return do, func() int { return ran }
}

// servedAgain sends requests with fresh keys until one is served, for at
// most sickRecovery, and returns when it was.
func servedAgain(t *testing.T, do func(key string) (time.Duration, error)) time.Time {
	t.Helper()
	deadline := time.Now().Add(sickRecovery)
	for i := 0; ; i++ {
		_, err := do(fmt.Sprintf("after-%d", i))
		if err == nil {
			return time.Now()
		}
		require.True(t, errors.Is(err, idem.ErrStoreUnavailable), "request %d after recovery: %v", i, err)
		require.True(t, time.Now().Before(deadline), "still refused %v after Redis answered: %v", sickRecovery, err)
		time.Sleep(5 * time.Millisecond) // a client's pause between requests
	}
}

// TestFailFastOrphanedKey: the key whose claim was on its way when Redis
// froze is being taken back; once the store is failing, its repeats are
// refused at once like any other request (not after waiting a budget for
// the take-back), and once Redis answers it runs.
func TestFailFastOrphanedKey(t *testing.T) {
	for _, c := range sickClients {
		t.Run(c.name, func(t *testing.T) {
			s := startSick(t, "SIGSTOP")
			g := s.guard(c.ctxTimeout)
			do, runs := timedDo(g)
			_, err := do("warm")
			require.NoError(t, err)

			s.freeze()
			_, err = do("orphan") // its claim is sent, and never answered
			require.ErrorIs(t, err, idem.ErrStoreUnavailable)
			start := time.Now()
			for i := 0; g.StoreState() != idem.StoreFailing; i++ {
				require.Less(t, i, failFastAfter, "still %q after %d refusals", g.StoreState(), i)
				require.Less(t, time.Since(start), failFastWithin)
				_, err := do(fmt.Sprintf("before-%d", i))
				require.ErrorIs(t, err, idem.ErrStoreUnavailable)
			}

			refusals := make([]time.Duration, 5)
			for i := range refusals {
				took, err := do("orphan")
				require.ErrorIs(t, err, idem.ErrStoreUnavailable)
				refusals[i] = took
			}
			slices.Sort(refusals)
			t.Logf("repeats of the orphaned key: median %v, max %v", refusals[2], refusals[4])
			require.Less(t, refusals[2], fastRefusal, "refused at once once failing")
			require.Equal(t, 1, runs(), "only the warm-up ran")

			back := s.resume()
			for {
				_, err := do("orphan")
				if err == nil {
					break
				}
				require.ErrorIs(t, err, idem.ErrStoreUnavailable)
				require.Less(t, time.Since(back), sickRecovery, "the orphaned key runs once Redis answers")
				time.Sleep(10 * time.Millisecond) // the client's retry pause
			}
			t.Logf("the orphaned key ran %v after Redis answered", time.Since(back).Round(time.Millisecond))
			require.Equal(t, 2, runs())
		})
	}
}
