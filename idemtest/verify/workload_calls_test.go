package verify

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// deadGuard returns a Guard whose Redis is gone: every call fails closed.
func deadGuard(t *testing.T) *idem.Guard {
	t.Helper()
	m, err := miniredis.Run()
	require.NoError(t, err)
	addr := m.Addr()
	m.Close()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	return idem.New(idem.NewRedisStore(c), idem.WithLogger(slog.New(slog.DiscardHandler)))
}

// retried drains and returns the keys w was asked to call again.
func retried(w *Workload) map[string]bool {
	keys := map[string]bool{}
	for {
		select {
		case k := <-w.retries:
			keys[k] = true
		default:
			return keys
		}
	}
}

// TestWorkloadRetries: a client retries some of its failed calls, through
// every entry point, and never one that succeeded; a probe is not retried.
func TestWorkloadRetries(t *testing.T) {
	ctx := context.Background()
	_, gs := miniGuards(t, 1, idem.WithWait(time.Second), idem.WithObserver(Observer()))
	dead := deadGuard(t)
	for _, via := range []Via{ViaDo, ViaHTTP, ViaOnce} {
		t.Run(via.String(), func(t *testing.T) {
			w := &Workload{Guards: gs, KeyPrefix: via.String(), Work: time.Nanosecond, Via: via}
			w.defaults()
			h := NewHistory()
			s := NewSink(h)
			for n := range 64 {
				w.call(ctx, gs[0], h, s, fmt.Sprint(w.KeyPrefix, n), "pay", uint64(n), false)
			}
			failed := map[string]bool{}
			calls, _, _ := h.snapshot()
			for _, c := range calls {
				require.Equal(t, via.String(), c.Via)
				if c.Kind != KindOK {
					failed[c.Key] = true
				}
			}
			require.Less(t, len(failed), 32, "the function fails now and then")
			for k := range retried(w) {
				require.True(t, failed[k], "%s succeeded and was retried", k)
			}

			for n := range 64 {
				w.call(ctx, dead, h, s, fmt.Sprint("dead", n), "pay", uint64(n), false)
			}
			require.NotEmpty(t, retried(w), "failed calls are retried")
			var keys []string
			for n := range 64 {
				keys = append(keys, fmt.Sprint("dead", n))
			}
			w.ProbeKeys(ctx, dead, h, s, keys)
			require.Empty(t, retried(w), "probes are not retried")
			r := Check(h)
			require.Equal(t, 64, r.Stuck, "the probes were refused")
			require.Equal(t, 64, r.Probes)
		})
	}
}

// TestWorkloadBursts: one client makes single calls and, one action in 8,
// a burst of 2 or 3 concurrent duplicates of a key; its next action
// starts once they all returned.
func TestWorkloadBursts(t *testing.T) {
	_, gs := miniGuards(t, 2, idem.WithWait(time.Second))
	w := &Workload{Guards: gs, Workers: 1, Keys: 100, KeyPrefix: "k", Work: time.Millisecond, Seed: 5}
	r, h, _ := runFor(t, w, 600, nil)
	require.True(t, r.OK(), "%v", r.Violations)
	calls, _, _ := h.snapshot()
	calls = slices.DeleteFunc(calls, func(c Call) bool { return c.Probe })
	slices.SortFunc(calls, func(a, b Call) int { return int(a.Start - b.Start) })
	// Group the calls that overlap: with one client, an action's calls.
	var sizes []int
	var end time.Duration
	for i, c := range calls {
		if i > 0 && c.Start < end {
			require.Equal(t, calls[i-1].Key, c.Key, "concurrent calls are duplicates")
			sizes[len(sizes)-1]++
			end = max(end, c.End)
			continue
		}
		sizes = append(sizes, 1)
		end = c.End
	}
	count := map[int]int{}
	for _, n := range sizes {
		count[n]++
	}
	t.Logf("actions by number of calls: %v", count)
	require.Positive(t, count[3], "bursts of 3")
	require.Zero(t, len(sizes)-count[1]-count[2]-count[3], "no burst beyond 3")
	require.Less(t, float64(count[2]+count[3])/float64(len(sizes)), 0.3, "bursts are the exception")
}
