package idem

// When a store batches: only while its callers queue (roundTrips), on
// synthetic times and on a real redis-server.

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/redistest"
)

// batchAsQueued makes s batch as when its callers queue, for good: a call
// made while more than pipeDirect calls are in flight rides a batch.
func batchAsQueued(s *RedisStore) *RedisStore {
	s.pipe.load.until.Store(math.MaxInt64)
	s.pipe.load.batching.Store(true)
	return s
}

// window1 times one window of direct calls that end at at (after the
// round trips' epoch), spread evenly from d to spread times d.
func (r *roundTrips) window1(at, d time.Duration, spread float64) {
	for i := range loadWindow {
		took := time.Duration(float64(d) * (1 + (spread-1)*float64(i)/loadWindow))
		r.took(at-took, at, true)
	}
}

// TestRoundTripsNetworkBound: calls that take about as long each time, as
// round trips over a network do, are never batched.
func TestRoundTripsNetworkBound(t *testing.T) {
	r := newRoundTrips()
	for i := range 100 {
		r.window1(time.Duration(i)*100*time.Millisecond, 500*time.Microsecond, 1.4)
		require.False(t, r.busy(), "window %d", i)
	}
}

// TestRoundTripsQueue: once calls take over queueFactor times the floor,
// two windows in a row, the store batches; one such window alone, between
// quick ones, does not make it batch. Calls in batches are not timed.
func TestRoundTripsQueue(t *testing.T) {
	r := newRoundTrips()
	at := time.Duration(0)
	next := func(d time.Duration, spread float64) {
		at += 50 * time.Millisecond
		r.window1(at, d, spread)
	}
	next(100*time.Microsecond, 1.2) // the floor: about 100 µs
	next(100*time.Microsecond, 1.2)
	next(300*time.Microsecond, 1.2) // medians about 330 µs
	require.False(t, r.busy(), "one window that queued")
	next(100*time.Microsecond, 1.2)
	next(300*time.Microsecond, 1.2)
	require.False(t, r.busy(), "queued, quick, queued")

	// Calls in batches do not count.
	for range 2 * loadWindow {
		r.took(at, at+time.Millisecond, false)
	}
	require.False(t, r.busy())
	next(300*time.Microsecond, 1.2)
	require.True(t, r.busy(), "two windows in a row that queued")
}

// TestRoundTripsHoldAndProbe: a store that found its callers queueing
// batches for max(loadHold, loadHoldWindows windows), then times one
// window of direct calls: if they still queue it batches again at once,
// else it goes on sending directly.
func TestRoundTripsHoldAndProbe(t *testing.T) {
	r := newRoundTrips()
	const step = 100 * time.Millisecond // a window's length
	for i := range 4 {
		d, spread := 100*time.Microsecond, 1.2
		if i >= 2 {
			d, spread = time.Millisecond, 1.2
		}
		r.window1(time.Duration(i+1)*step, d, spread)
	}
	require.True(t, r.busy())
	queuedAt := 4 * step
	hold := max(loadHold, loadHoldWindows*step) // 1.6 s

	// Direct calls while batching (with few in flight) are not timed,
	// and the store batches until the hold is over.
	r.window1(queuedAt+hold-time.Millisecond, time.Millisecond, 1.2)
	require.True(t, r.busy(), "before the hold is over")
	r.took(queuedAt+hold, queuedAt+hold, true)
	require.False(t, r.busy(), "the hold is over: a window of direct calls")

	// The callers still queue: batching again after this one window.
	r.window1(queuedAt+hold+step, time.Millisecond, 1.2)
	require.True(t, r.busy(), "a probe that queued")

	// After the next hold, the queue is gone: direct calls from then on.
	probe := queuedAt + 2*hold + step
	r.took(probe, probe, true)
	require.False(t, r.busy())
	for i := range 20 {
		r.window1(probe+time.Duration(i+1)*step, 100*time.Microsecond, 1.2)
		require.False(t, r.busy(), "window %d after the queue", i)
	}
}

// TestRoundTripsSlowerNetwork: when the round trip itself grows (a farther
// server), the store may batch for a while, but the floor follows within
// two loadPeriods, and then it sends directly again.
func TestRoundTripsSlowerNetwork(t *testing.T) {
	r := newRoundTrips()
	r.window1(time.Millisecond, 100*time.Microsecond, 1.2)
	r.window1(2*time.Millisecond, 100*time.Microsecond, 1.2)
	const step = 50 * time.Millisecond
	at := time.Second
	for ; at < 3*loadPeriod; at += step {
		// A call that ends after the hold ends it, then a window.
		r.took(at-step/2, at-step/2, true)
		r.window1(at, 400*time.Microsecond, 1.2)
	}
	for i := range 20 {
		r.window1(at+time.Duration(i)*step, 400*time.Microsecond, 1.2)
		require.False(t, r.busy(), "window %d after two periods", i)
	}
}

// delayHook delays every command and pipeline by a duration it is set to.
type delayHook struct{ d atomic.Int64 }

func (h *delayHook) wait() {
	if d := time.Duration(h.d.Load()); d > 0 {
		time.Sleep(d)
	}
}

func (h *delayHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *delayHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.wait(); return next(ctx, cmd) }
}
func (h *delayHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.wait(); return next(ctx, cmds) }
}

// TestAutoPipelineNetworkBound: 8 callers behind a 10 ms round trip, more
// than pipeDirect in flight, wait on the network and not in a queue: the
// default store sends every call directly.
//
// Not parallel: the other tests' load on the process would queue its
// calls for CPU.
func TestAutoPipelineNetworkBound(t *testing.T) {
	c := redistest.Shared(t).Client(t)
	h := &delayHook{}
	h.d.Store(int64(10 * time.Millisecond))
	c.AddHook(h)
	spy := newPipeSpy()
	c.AddHook(spy)
	s := NewRedisStore(c, WithPrefix(redistest.Prefix(t)))
	doFreshKeys(t, New(s, quietLog), 8, 48) // 768 calls: three windows
	direct, pipelined, _ := spy.counts()
	require.Empty(t, pipelined)
	require.GreaterOrEqual(t, direct["claim"], 384)
	require.GreaterOrEqual(t, s.pipe.load.floor, int64(10*time.Millisecond), "windows were judged")
}

// TestAutoPipelineQueued: 16 callers whose calls take 3 ms where the
// quickest took far less (a server that became busy): the default store
// starts batching, and batches carry several calls.
func TestAutoPipelineQueued(t *testing.T) {
	t.Parallel()
	c := redistest.Shared(t).Client(t)
	h := &delayHook{}
	c.AddHook(h)
	spy := newPipeSpy()
	c.AddHook(spy)
	s := NewRedisStore(c, WithPrefix(redistest.Prefix(t)))
	g := New(s, quietLog)
	// Quick calls, at most pipeDirect in flight: sent directly, timed.
	doFreshKeys(t, g, pipeDirect, 128) // 1024 calls: four windows
	_, pipelined, _ := spy.counts()
	require.Empty(t, pipelined)

	h.d.Store(int64(3 * time.Millisecond))
	doFreshKeys(t, g, 16, 100)
	_, pipelined, shared := spy.counts()
	require.NotEmpty(t, pipelined, "no call rode a batch")
	require.Positive(t, shared, "no batch of two calls or more")
}
