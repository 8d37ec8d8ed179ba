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
// measured around it (a slow machine only makes fewer calls).
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
	require.Positive(t, w.Calls())
	t.Logf("%d calls in %v at -rate %d", w.Calls(), elapsed, rate)
}
