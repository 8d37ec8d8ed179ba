package verify

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestPacer: over a fake clock, with workers asking at random times for
// single calls and bursts, the calls started by any time never exceed
// rate × elapsed + 1, and a pacer asked often enough keeps the rate.
func TestPacer(t *testing.T) {
	for _, rate := range []int{1, 3, 100, 1000, 7919} {
		var p pacer
		rnd := rand.New(rand.NewPCG(uint64(rate), 1))
		t0 := time.Unix(1_000_000, 0)
		now := t0
		var starts []time.Time
		for range 5000 {
			now = now.Add(time.Duration(rnd.Int64N(int64(2 * time.Second / time.Duration(rate)))))
			n := 1
			if rnd.IntN(8) == 0 {
				n = 2 + rnd.IntN(2)
			}
			at := p.reserve(now, rate, n)
			require.False(t, at.Before(now), "never in the past")
			for range n {
				starts = append(starts, at)
			}
			if at.After(now) {
				now = at // the caller waits for its slot
			}
		}
		first := starts[0]
		for i, s := range starts {
			// calls started by s: at least i+1
			elapsed := s.Sub(first).Seconds()
			require.LessOrEqual(t, float64(i+1), float64(rate)*elapsed+1, "rate %d: call %d at %v", rate, i, s.Sub(first))
		}
		span := starts[len(starts)-1].Sub(first).Seconds()
		assert.InDelta(t, float64(rate), float64(len(starts)-1)/span, float64(rate)*0.6, "rate %d: kept roughly, asked at twice the rate on average", rate)
	}
}

// TestWorkloadRate: the workload starts at most Rate calls a second, bursts
// of concurrent duplicates included: counted over the run's own duration,
// measured around it (a slow machine only makes fewer calls), and at
// least a tenth of it: the workload does not idle (how closely the pace is
// kept is TestPacerSlots', on a clock of its own; here the race detector on
// a loaded machine may starve the workers of CPU).
func TestWorkloadRate(t *testing.T) {
	_, gs := miniGuards(t, 2, idem.WithWait(time.Second))
	const rate = 200
	w := &Workload{Guards: gs, Workers: 16, Keys: 100, KeyPrefix: "k", Rate: rate, Work: time.Millisecond, Seed: 7}
	h := NewHistory()
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	w.Run(ctx, h, NewSink(h))
	elapsed := time.Since(start)
	require.LessOrEqual(t, float64(w.Calls()), rate*elapsed.Seconds()+1, "%d calls in %v", w.Calls(), elapsed)
	require.GreaterOrEqual(t, float64(w.Calls()), rate*elapsed.Seconds()/10, "the rate is kept, not only bounded: %d calls in %v", w.Calls(), elapsed)
	t.Logf("%d calls in %v at -rate %d", w.Calls(), elapsed, rate)
}

// TestPacerSlots: the slots are 1s/rate apart, rounded up to the
// nanosecond; a burst of n takes n consecutive slots and starts at the
// last; a slot in the past is not given out.
func TestPacerSlots(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	var p pacer
	require.Equal(t, t0, p.reserve(t0, 1000, 1), "the first call starts at once")
	require.Equal(t, t0.Add(time.Millisecond), p.reserve(t0, 1000, 1))
	require.Equal(t, t0.Add(4*time.Millisecond), p.reserve(t0, 1000, 3), "slots 2, 3 and 4 ms")
	require.Equal(t, t0.Add(5*time.Millisecond), p.reserve(t0.Add(time.Millisecond), 1000, 1))
	later := t0.Add(time.Second)
	require.Equal(t, later, p.reserve(later, 1000, 1), "time lost is not made up")
	require.Equal(t, later.Add(2*time.Millisecond), p.reserve(later, 1000, 2))

	var q pacer
	q.reserve(t0, 3, 1)
	require.Equal(t, t0.Add(333_333_334), q.reserve(t0, 3, 1), "1s/3 rounded up")
	require.Equal(t, t0.Add(time.Second+2), q.reserve(t0, 3, 2))
}
