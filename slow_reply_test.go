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
	"fmt"
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
	for _, src := range []string{claimLua, heartbeatLua, checkpointLua, completeLua, releaseLua, unclaimLua} {
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

// slow returns a Guard whose client goes through the proxy. Its store
// timeout is far above every delay, so that the lease alone decides; an
// option given may set another.
func (r *slowRig) slow(t *testing.T, mode clientMode, opts ...Option) *Guard {
	t.Helper()
	opts = append([]Option{WithStoreTimeout(time.Minute)}, opts...)
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
	tests := []struct {
		name   string
		delays []slowDelay
		// holderRuns: whether the holder's fn starts at all.
		holderRuns bool
	}{
		{
			// The claim answers after the whole lease: the lease may be
			// anybody's by now.
			name:   "claim reply after the lease",
			delays: []slowDelay{{claimLua, 1200 * time.Millisecond, 1}},
		},
		{
			// The claim answers after lease/3 and is renewed; the renewal
			// itself answers after the lease it set ran out, by which time
			// the waiter has taken over in Redis.
			name:   "claim late, renewal later than its lease",
			delays: []slowDelay{{claimLua, 400 * time.Millisecond, 1}, {heartbeatLua, 1100 * time.Millisecond, 1}},
		},
		{
			// The claim answers after lease/3 and is renewed; the renewal
			// answers within the lease it set but past its margin against
			// drift (a tenth): too late as well.
			name:   "claim late, renewal past its margin",
			delays: []slowDelay{{claimLua, 400 * time.Millisecond, 1}, {heartbeatLua, 950 * time.Millisecond, 1}},
		},
		{
			// The first heartbeat answers after the lease it renewed: fn
			// must be cancelled by then, before the waiter can take over.
			name:       "heartbeat reply after the lease",
			delays:     []slowDelay{{heartbeatLua, 1500 * time.Millisecond, 1}},
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
				// Where the holder must run, its claim must answer within
				// lease/3 of being sent, or it is renewed first, and that
				// renewal is the delayed heartbeat. On a loaded machine the
				// library may so find the claim late, as it must: that try
				// proves nothing about a late heartbeat, and the next runs
				// on a fresh key.
				const tries = 10
				for try := 1; ; try++ {
					require.LessOrEqual(t, try, tries, "in each of %d tries the holder's claim answered later than lease/3", tries)
					if slowRepliesTry(t, r, holder, waiter, fmt.Sprintf("k%d", try), tt.delays, tt.holderRuns) {
						return
					}
				}
			})
		}
	}
}

// A slowDelay delays the replies of the next n runs of script by d.
type slowDelay struct {
	script string
	d      time.Duration
	n      int
}

// slowRepliesTry runs one try of a TestSlowReplies row on key. It reports
// false when the holder was to run but the library refused its claim as
// answered too late (measured from when it was sent): the try is consistent
// and safe, but proves nothing about the row.
func slowRepliesTry(t *testing.T, r *slowRig, holder, waiter *Guard, key string, delays []slowDelay, holderRuns bool) (proven bool) {
	t.Helper()
	r.proxy.ClearRules()
	for _, d := range delays {
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
		holderV, holderErr = Do(ctx, holder, key, faultReq{}, fn("holder", true))
	})
	wg.Go(func() {
		// Start waiting once the holder's claim is in Redis.
		_, store := r.direct(t)
		require.Eventually(t, func() bool {
			rec, err := store.Read(ctx, opID(key))
			return err == nil && rec != nil
		}, 30*time.Second, 2*time.Millisecond) // a hang guard
		close(claimed)
		waiterV, waiterErr = Do(ctx, waiter, key, faultReq{}, fn("waiter", false))
	})
	wg.Wait()
	<-claimed

	require.Zero(t, overlaps.Load(), "fn ran in two places at once")
	require.NoError(t, waiterErr)
	require.Equal(t, "waiter", waiterV, "the waiter took the key over and ran fn")
	if holderRuns && !refusedLate(holderErr) {
		require.Equal(t, int32(2), runs.Load())
		require.ErrorIs(t, holderErr, ErrLeaseLost)
		return true
	}
	require.Equal(t, int32(1), runs.Load(), "the holder started fn on a lease that had run out")
	require.ErrorIs(t, holderErr, ErrStoreUnavailable, "fn not run")
	require.ErrorIs(t, holderErr, ErrLeaseLost, "a reply after the lease it set, or a renewal's after its margin, means the lease is lost")
	require.NotErrorIs(t, holderErr, ErrNotRecorded)
	require.Empty(t, holderV)
	return !holderRuns
}

// TestLateClaimRenewed: a claim that answers after lease/3 but well within
// its lease is renewed before fn starts, so that fn starts with most of a
// lease, and fn runs once.
func TestLateClaimRenewed(t *testing.T) {
	t.Parallel()
	const lease = 3 * time.Second // lease/3 is 1s, the margin ends at 2.7s
	for _, mode := range clientModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			r := newSlowRig(t)
			holder := r.slow(t, mode, WithLease(lease))
			r.proxy.DelayReplies(redistest.MatchScript(claimLua), 1300*time.Millisecond, 1)
			renewals := r.proxy.DelayReplies(redistest.MatchScript(heartbeatLua), 0, 100) // counts them
			var runs atomic.Int32
			var renewedBefore int
			v, err := Do(context.Background(), holder, "k", faultReq{}, func(ctx context.Context, a *Attempt) (string, error) {
				runs.Add(1)
				renewedBefore = renewals()
				return "v", nil
			})
			require.NoError(t, err)
			require.Equal(t, "v", v)
			require.Equal(t, int32(1), runs.Load())
			require.Equal(t, 1, renewedBefore, "the late claim was renewed once before fn started")
		})
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
			// A lease no claim's reply outlasts on a loaded machine: the
			// test is about the completion, not the lease.
			holder := r.slow(t, m, WithLease(time.Minute), WithWriteTimeout(300*time.Millisecond))
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
		WithLease(time.Minute), WithWriteTimeout(300*time.Millisecond)) // a lease no claim outlasts, as above
	r.proxy.DelayReplies(redistest.MatchScript(releaseLua), time.Minute, 1)
	boom := errors.New("boom")
	start := time.Now()
	_, err := Do(context.Background(), holder, "k", faultReq{}, func(ctx context.Context, a *Attempt) (string, error) {
		return "", boom
	})
	require.ErrorIs(t, err, boom)
	require.Less(t, time.Since(start), 10*300*time.Millisecond, "generous: ten write timeouts, far below the ReadTimeout and the delay")
}

// TestHolderCutOff: once the holder's commands stop reaching Redis (the
// proxy holds back every byte it sends), none of its renewals lands, and its
// lease ends in Redis a lease after its claim arrived. The holder measures
// that lease from when it sent the claim, less a tenth against clock drift:
// fn is cancelled with ErrLeaseLost before the waiter, which takes the key
// over as soon as Redis lets it, starts fn.
func TestHolderCutOff(t *testing.T) {
	t.Parallel()
	const lease = 1500 * time.Millisecond // a margin of 150ms
	for _, mode := range clientModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			r := newSlowRig(t)
			holder := r.slow(t, mode, WithLease(lease), WithWriteTimeout(300*time.Millisecond))
			waiter, _ := r.direct(t, WithLease(lease), WithWait(10*time.Second))
			ctx := context.Background()
			var holderEnd, waiterStart time.Time
			var holderErr error
			running, done := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(done)
				_, holderErr = Do(ctx, holder, "k", faultReq{}, func(ctx context.Context, a *Attempt) (string, error) {
					r.proxy.SetDelay(time.Minute, 0) // from now on nothing the holder sends arrives
					close(running)
					select {
					case <-ctx.Done():
					case <-time.After(10 * lease): // a hang guard
					}
					holderEnd = time.Now()
					return "holder", context.Cause(ctx)
				})
			}()
			select {
			case <-running:
			case <-done:
				t.Fatalf("the holder's fn did not run: %v", holderErr)
			}
			v, err := Do(ctx, waiter, "k", faultReq{}, func(context.Context, *Attempt) (string, error) {
				waiterStart = time.Now()
				return "waiter", nil
			})
			<-done
			require.NoError(t, err)
			require.Equal(t, "waiter", v, "the waiter took the key over")
			require.ErrorIs(t, holderErr, ErrLeaseLost)
			require.True(t, holderEnd.Before(waiterStart), "the holder's fn ran %v after the waiter's started", holderEnd.Sub(waiterStart))
			r.proxy.Close() // nobody waits for the held-back bytes
		})
	}
}
