package verify

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// miniGuards returns n Guards sharing one miniredis.
func miniGuards(t *testing.T, n int, opts ...idem.Option) (*miniredis.Miniredis, []*idem.Guard) {
	t.Helper()
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	var gs []*idem.Guard
	for range n {
		s := idem.NewRedisStore(c, idem.WithPrefix("verify"))
		gs = append(gs, idem.New(s, append([]idem.Option{idem.WithLogger(slog.New(slog.DiscardHandler))}, opts...)...))
	}
	return m, gs
}

// runFor runs w for the given number of calls (not a duration: a count is
// what the test needs) and then probes; a run that stops making calls
// fails.
func runFor(t *testing.T, w *Workload, calls int64, between func(h *History)) (*Report, *History, *Sink) {
	t.Helper()
	h := NewHistory()
	s := NewSink(h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx, h, s)
	}()
	defer func() {
		cancel()
		<-done
	}()
	// A run that stops making calls fails within stall.
	const stall = 10 * time.Second
	waitCalls := func(n int64) {
		last, since := w.Calls(), time.Now()
		for w.Calls() < n {
			if c := w.Calls(); c != last {
				last, since = c, time.Now()
			} else if time.Since(since) > stall {
				t.Fatalf("no call for %v: %d calls, want %d", stall, c, n)
			}
			select {
			case <-done:
				t.Fatalf("Run returned after %d calls, want %d", w.Calls(), n)
			case <-time.After(time.Millisecond): // polls a counter: nothing to wait on
			}
		}
	}
	waitCalls(calls / 2)
	if between != nil {
		between(h)
	}
	waitCalls(calls)
	cancel()
	<-done
	w.Probe(context.Background(), w.Guards[0], h, s)
	return Check(h), h, s
}

// requireSound checks what a run on a sound server shows beyond the
// invariants: every call went through its key's entry point, handed out the
// value of the effect the sink accepted for its key, and was probed; one
// call in 50 or so carried another request.
func requireSound(t *testing.T, w *Workload, h *History, s *Sink) {
	t.Helper()
	calls, _, _ := h.snapshot()
	used, probed := map[string]bool{}, map[string]bool{}
	other := 0
	for _, c := range calls {
		require.Equal(t, w.viaOf(c.Key).String(), c.Via)
		if c.Kind == KindOK && c.Via != ViaOnce.String() { // Once hands out no value
			v, ok := s.Lookup(c.Key, 0)
			require.True(t, ok, c.Key)
			require.Equal(t, v, c.Result)
		}
		if c.Probe {
			probed[c.Key] = true
			continue
		}
		used[c.Key] = true
		if c.Request != "pay" {
			require.Equal(t, "other", c.Request)
			other++
		}
	}
	require.Equal(t, used, probed, "every key used is probed")
	require.Len(t, used, w.KeysUsed())
	require.Positive(t, other)
	require.Less(t, other, len(calls)/10)
}

func TestWorkloadClean(t *testing.T) {
	_, gs := miniGuards(t, 3, idem.WithWait(time.Second))
	w := &Workload{Guards: gs, Workers: 8, Keys: 200, KeyPrefix: "k", Payload: 100, Seed: 1}
	r, h, s := runFor(t, w, 2000, nil)
	require.True(t, r.OK(), "%v", r.Violations)
	requireSound(t, w, h, s)
	require.GreaterOrEqual(t, r.Operations, 2000)
	require.Equal(t, 200, r.Probes)
	require.Positive(t, r.Ran)
	require.Less(t, r.Ran, r.Operations-r.Probes, "repeats replay")
	require.Positive(t, r.Effects)
}

// TestWorkloadCatchesDataLoss: Redis loses every record mid-run (a restart
// without persistence): keys run again at fence 1, their effects are
// accepted twice and the results handed out before are lost.
func TestWorkloadCatchesDataLoss(t *testing.T) {
	m, gs := miniGuards(t, 2, idem.WithWait(time.Second))
	w := &Workload{Guards: gs, Workers: 8, Keys: 50, KeyPrefix: "k", Seed: 2}
	r, _, _ := runFor(t, w, 3000, func(h *History) {
		h.AddFault(Fault{Name: "FLUSHALL", Limit: LimitRestart, Start: h.Now(), End: -1})
		m.FlushAll()
	})
	require.False(t, r.OK())
	require.Positive(t, r.Duplicates)
	require.Positive(t, r.Lost)
	require.Equal(t, r.Total(), r.FromLimits, "every violation is blamed on the restart")
	require.Contains(t, r.Violations[0].String(), "restart without persistence")
}

// TestWorkloadVia runs the workload through the HTTP middleware, Once and
// all three entry points (Do alone: the tests above): no violation on a
// sound server, and the data loss of a FLUSHALL caught.
func TestWorkloadVia(t *testing.T) {
	for _, via := range []Via{ViaHTTP, ViaOnce, ViaAll} {
		t.Run(via.String(), func(t *testing.T) {
			t.Parallel()
			_, gs := miniGuards(t, 2, idem.WithWait(time.Second), idem.WithObserver(Observer()))
			w := &Workload{Guards: gs, Workers: 8, Keys: 100, KeyPrefix: "k", Payload: 100, Seed: 3, Via: via}
			r, h, s := runFor(t, w, 1000, nil)
			require.True(t, r.OK(), "%v", r.Violations)
			requireSound(t, w, h, s)
			require.Equal(t, 100, r.Probes)
			require.Positive(t, r.Effects)
			require.Less(t, r.Ran, r.Operations-r.Probes, "repeats replay")
			require.Positive(t, r.Errors[KindPermanent], "permanent errors are stored and replayed")

			m, gs := miniGuards(t, 2, idem.WithWait(time.Second), idem.WithObserver(Observer()))
			w = &Workload{Guards: gs, Workers: 8, Keys: 50, KeyPrefix: "k", Seed: 4, Via: via}
			r, _, _ = runFor(t, w, 1200, func(h *History) {
				h.AddFault(Fault{Name: "FLUSHALL", Limit: LimitRestart, Start: h.Now(), End: -1})
				m.FlushAll()
			})
			require.Positive(t, r.Lost, "results lost by the FLUSHALL")
			require.Equal(t, r.Total(), r.FromLimits)
		})
	}
}

// TestPickPastTheLastKey: clients that race for the last new key count past
// Keys; KeysUsed stays at Keys, and a key used before is one of the Keys.
func TestPickPastTheLastKey(t *testing.T) {
	w := &Workload{Keys: 4, KeyPrefix: "k", retries: make(chan string, 1)}
	w.next.Store(int64(w.Keys) + 3)
	require.Equal(t, w.Keys, w.KeysUsed())
	rnd := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		key, _ := w.pick(rnd)
		n, err := strconv.Atoi(strings.TrimPrefix(key, "k"))
		require.NoError(t, err)
		require.Less(t, n, w.Keys, key)
	}
}
