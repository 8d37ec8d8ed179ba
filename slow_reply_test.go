//go:build unix

package idem

// Slow replies on a real redis-server: a proxy (internal/redistest) delays
// the replies of chosen scripts after Redis ran them on time. The rule under
// test: a lease is valid until the send time of the command that set it plus
// the lease, less the margin; a reply that arrives later means the lease is
// lost, whatever it says. It must hold with go-redis defaults (context
// deadlines ignored, ReadTimeout 3s) and with ContextTimeoutEnabled.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/redistest"
)

// slowRig is a redis-server, a proxy in front of it and a prefix.
type slowRig struct {
	srv    *redistest.Server
	proxy  *redistest.Proxy
	prefix string
}

func newSlowRig(t *testing.T) *slowRig {
	t.Helper()
	srv := redistest.Shared(t)
	// Load the scripts, so that a delayed reply is the reply of a script
	// that ran, not a NOSCRIPT error.
	c := srv.Client(t)
	for _, src := range []string{claimLua, heartbeatLua, checkpointLua, completeLua, releaseLua} {
		require.NoError(t, c.ScriptLoad(context.Background(), src).Err())
	}
	return &slowRig{srv: srv, proxy: redistest.StartProxy(t, srv.Addr()), prefix: redistest.Prefix(t)}
}

// clientMode is a go-redis configuration a slow-reply test runs under, and
// whether the store auto-pipelines every call that may be.
type clientMode struct {
	name      string
	opts      func(*redis.Options)
	pipelined bool
}

// clientModes are the configurations every slow-reply test runs under.
var clientModes = []clientMode{
	{name: "go-redis defaults", opts: func(*redis.Options) {}},
	{name: "ContextTimeoutEnabled", opts: func(o *redis.Options) { o.ContextTimeoutEnabled = true }},
	{name: "auto-pipelined", opts: func(*redis.Options) {}, pipelined: true},
}

// slow returns a Guard whose client goes through the proxy.
func (r *slowRig) slow(t *testing.T, mode clientMode, opts ...Option) *Guard {
	t.Helper()
	o := &redis.Options{Addr: r.proxy.Addr()}
	mode.opts(o)
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.Ping(context.Background()).Err()) // connect before any rule is armed
	if !mode.pipelined {
		g, _ := faultGuard(c, r.prefix, opts...)
		return g
	}
	s := PipelineEveryCall(NewRedisStore(c, WithPrefix(r.prefix), WithAutoPipeline()))
	return New(s, append([]Option{quietLog}, opts...)...)
}

// direct returns a Guard on the server itself.
func (r *slowRig) direct(t *testing.T, opts ...Option) (*Guard, *RedisStore) {
	t.Helper()
	return faultGuard(r.srv.Client(t), r.prefix, opts...)
}

// TestSlowReplies is the timing table: each row delays some replies of the
// holder's scripts, while a second replica waits on the same key and takes
// it over as soon as Redis lets it. fn must never run in two places at once,
// and the holder must never start fn on a lease that may have run out.
func TestSlowReplies(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	type delay struct {
		script string
		d      time.Duration
		n      int
	}
	tests := []struct {
		name   string
		delays []delay
		// holderRuns: whether the holder's fn starts at all.
		holderRuns bool
	}{
		{
			// The claim answers after the whole lease: the lease may be
			// anybody's by now.
			name:   "claim reply after the lease",
			delays: []delay{{claimLua, 1200 * time.Millisecond, 1}},
		},
		{
			// The claim answers after lease/3 and is renewed; the renewal
			// itself answers after the lease it set ran out, by which time
			// the waiter has taken over in Redis.
			name:   "claim late, renewal later than its lease",
			delays: []delay{{claimLua, 400 * time.Millisecond, 1}, {heartbeatLua, 1100 * time.Millisecond, 1}},
		},
		{
			// The first heartbeat answers after the lease it renewed: fn
			// must be cancelled by then, before the waiter can take over.
			name:       "heartbeat reply after the lease",
			delays:     []delay{{heartbeatLua, 1500 * time.Millisecond, 1}},
			holderRuns: true,
		},
	}
	for _, tt := range tests {
		for _, mode := range clientModes {
			t.Run(tt.name+"/"+mode.name, func(t *testing.T) {
				t.Parallel()
				r := newSlowRig(t)
				holder := r.slow(t, mode, WithLease(lease))
				waiter, _ := r.direct(t, WithLease(lease), WithWait(5*time.Second))
				for _, d := range tt.delays {
					r.proxy.DelayReplies(redistest.MatchScript(d.script), d.d, d.n)
				}

				var running atomic.Int32 // fns running right now
				var runs, overlaps atomic.Int32
				fn := func(who string, block bool) func(context.Context, *Attempt) (string, error) {
					return func(ctx context.Context, a *Attempt) (string, error) {
						if running.Add(1) > 1 {
							overlaps.Add(1)
						}
						defer running.Add(-1)
						runs.Add(1)
						if block { // run until the lease is lost, at most 5s
							select {
							case <-ctx.Done():
								return "", context.Cause(ctx)
							case <-time.After(5 * time.Second):
							}
						}
						return who, nil
					}
				}
				ctx := context.Background()
				var wg sync.WaitGroup
				var holderV, waiterV string
				var holderErr, waiterErr error
				claimed := make(chan struct{})
				wg.Go(func() {
					holderV, holderErr = Do(ctx, holder, "k", faultReq{}, fn("holder", true))
				})
				wg.Go(func() {
					// Start waiting once the holder's claim is in Redis.
					_, store := r.direct(t)
					require.Eventually(t, func() bool {
						rec, err := store.Read(ctx, opID("k"))
						return err == nil && rec != nil
					}, 2*time.Second, 2*time.Millisecond)
					close(claimed)
					waiterV, waiterErr = Do(ctx, waiter, "k", faultReq{}, fn("waiter", false))
				})
				wg.Wait()
				<-claimed

				require.Zero(t, overlaps.Load(), "fn ran in two places at once")
				require.NoError(t, waiterErr)
				require.Equal(t, "waiter", waiterV, "the waiter took the key over and ran fn")
				if tt.holderRuns {
					require.Equal(t, int32(2), runs.Load())
					require.ErrorIs(t, holderErr, ErrLeaseLost)
				} else {
					require.Equal(t, int32(1), runs.Load(), "the holder started fn on a lease that had run out")
					require.ErrorIs(t, holderErr, ErrStoreUnavailable, "fn not run")
					require.NotErrorIs(t, holderErr, ErrNotRecorded)
					require.Empty(t, holderV)
				}
			})
		}
	}
}

// TestSlowCompleteIsBounded: a completion whose reply is late is given up
// after the Guard's write timeout even when go-redis would wait longer (here
// a ReadTimeout of 10s): the caller gets fn's value with ErrNotRecorded and
// ErrStoreUnavailable (the outcome is unknown). The completion did run, so a
// repeat replays it and fn ran once.
func TestSlowCompleteIsBounded(t *testing.T) {
	t.Parallel()
	for _, mode := range clientModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			r := newSlowRig(t)
			m := mode
			m.opts = func(o *redis.Options) { mode.opts(o); o.ReadTimeout = 10 * time.Second }
			holder := r.slow(t, m, WithLease(time.Second), WithWriteTimeout(300*time.Millisecond))
			r.proxy.DelayReplies(redistest.MatchScript(completeLua), time.Minute, 1)
			var runs atomic.Int32
			fn := func(ctx context.Context, a *Attempt) (string, error) { runs.Add(1); return "v", nil }

			start := time.Now()
			v, err := Do(context.Background(), holder, "k", faultReq{}, fn)
			took := time.Since(start)
			require.Equal(t, "v", v)
			require.ErrorIs(t, err, ErrNotRecorded)
			require.ErrorIs(t, err, ErrStoreUnavailable)
			require.Less(t, took, 10*300*time.Millisecond, "Do waited %v for a completion bounded at 300ms (a bound generous enough for any load, far below the ReadTimeout and the delay)", took)

			g, _ := r.direct(t)
			v, err = Do(context.Background(), g, "k", faultReq{}, fn)
			require.NoError(t, err)
			require.Equal(t, "v", v)
			require.Equal(t, int32(1), runs.Load())
			r.proxy.Close() // nobody waits for the late reply: its connection goes
		})
	}
}

// TestSlowReleaseIsBounded: fn fails and its release answers late; Do
// returns fn's error after the write timeout, not after the reply.
func TestSlowReleaseIsBounded(t *testing.T) {
	t.Parallel()
	r := newSlowRig(t)
	holder := r.slow(t, clientMode{opts: func(o *redis.Options) { o.ReadTimeout = 10 * time.Second }},
		WithLease(time.Second), WithWriteTimeout(300*time.Millisecond))
	r.proxy.DelayReplies(redistest.MatchScript(releaseLua), time.Minute, 1)
	boom := errors.New("boom")
	start := time.Now()
	_, err := Do(context.Background(), holder, "k", faultReq{}, func(ctx context.Context, a *Attempt) (string, error) {
		return "", boom
	})
	require.ErrorIs(t, err, boom)
	require.Less(t, time.Since(start), 10*300*time.Millisecond, "generous: ten write timeouts, far below the ReadTimeout and the delay")
}
