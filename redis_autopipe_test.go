package idem

// WithAutoPipeline on a real redis-server and a real cluster: what rides
// the store's batches, what does not, and that duplicates still run once.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/redistest"
)

// PipelineEveryCall makes every later call of s that may ride a batch
// ride one, a call alone in flight too. For tests of package idem_test.
func PipelineEveryCall(s *RedisStore) *RedisStore {
	if s != nil && s.pipe != nil {
		s.pipe.every = true
	}
	return s
}

// pipeSpy counts, by a hook on the client, the store's scripts sent one by
// one and sent in pipelines (the store's batches, of one command or more).
type pipeSpy struct {
	mu        sync.Mutex
	direct    map[string]int // script name → commands sent alone
	pipelined map[string]int // script name → commands sent in a pipeline
	shared    int            // pipelines of two or more store scripts
	evals     int            // scripts sent as EVAL
}

func newPipeSpy() *pipeSpy {
	return &pipeSpy{direct: map[string]int{}, pipelined: map[string]int{}}
}

var scriptNames = map[any]string{
	claimScript.sha: "claim", heartbeatScript.sha: "heartbeat", checkpointScript.sha: "checkpoint",
	completeScript.sha: "complete", releaseScript.sha: "release",
}

// name returns the store script cmd runs, or "".
func (p *pipeSpy) name(cmd redis.Cmder) string { return scriptName(cmd) }

// scriptName returns the store script cmd runs, or "".
func scriptName(cmd redis.Cmder) string {
	a := cmd.Args()
	if len(a) < 2 || (cmd.Name() != "evalsha" && cmd.Name() != "eval") {
		return ""
	}
	if cmd.Name() == "eval" {
		for _, sc := range []*luaScript{claimScript, heartbeatScript, checkpointScript, completeScript, releaseScript} {
			if a[1] == sc.src {
				return scriptNames[sc.sha]
			}
		}
	}
	return scriptNames[a[1]]
}

func (p *pipeSpy) DialHook(next redis.DialHook) redis.DialHook { return next }

func (p *pipeSpy) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := p.name(cmd); n != "" {
			p.mu.Lock()
			p.direct[n]++
			if cmd.Name() == "eval" {
				p.evals++
			}
			p.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (p *pipeSpy) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		p.mu.Lock()
		scripts := 0
		for _, cmd := range cmds {
			if n := p.name(cmd); n != "" {
				p.pipelined[n]++
				scripts++
				if cmd.Name() == "eval" {
					p.evals++
				}
			}
		}
		if scripts > 1 {
			p.shared++
		}
		p.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (p *pipeSpy) counts() (direct, pipelined map[string]int, shared int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return clone(p.direct), clone(p.pipelined), p.shared
}

func (p *pipeSpy) evalCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.evals
}

func clone(m map[string]int) map[string]int {
	c := make(map[string]int, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// TestAutoPipelineClients: the store batches on any client it can use,
// whatever the client's own auto-pipeliner options (go-redis's pipeliner
// is not used); a nil client or a Ring fails closed as without the option.
func TestAutoPipelineClients(t *testing.T) {
	ctx := context.Background()
	for _, s := range []*RedisStore{
		NewRedisStore(nil, WithAutoPipeline()),
		NewRedisStore((*redis.Client)(nil), WithAutoPipeline()),
		NewRedisStore(redis.NewRing(&redis.RingOptions{}), WithAutoPipeline()),
	} {
		_, err := s.Read(ctx, "x")
		require.ErrorIs(t, err, ErrStoreUnavailable)
	}

	// A pipelined call returns by its context's deadline: with
	// ContextTimeoutEnabled, the Guard still writes on the caller's goroutine.
	ct := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = ct.Close() })
	require.True(t, NewRedisStore(ct).ReturnsByDeadline())
	require.True(t, NewRedisStore(ct, WithAutoPipeline()).ReturnsByDeadline())

	// Options go-redis's deferred auto-pipeliner refuses, and a client
	// type of the application's own.
	o := redistest.Shared(t).Options()
	o.AutoPipelineOptions = &redis.AutoPipelineOptions{NumShards: 2}
	sh := redis.NewClient(o)
	t.Cleanup(func() { _ = sh.Close() })
	type wrapped struct{ *redis.Client }
	for _, c := range []redis.UniversalClient{sh, wrapped{sh}} {
		s := PipelineEveryCall(NewRedisStore(c, WithPrefix(redistest.Prefix(t)), WithAutoPipeline()))
		res, err := s.Claim(ctx, fmt.Sprintf("%T", c), idemstore.ClaimRequest{Owner: "o", Lease: time.Second, TTL: time.Minute})
		require.NoError(t, err)
		require.Equal(t, idemstore.ClaimOK, res.Status)
	}
}

// batchSpy records, by a hook on the client, how many of the store's
// batches are on the wire at once and the largest one. A pipeline without
// a store script (the one that sets up a new connection) is not a batch.
type batchSpy struct {
	onWire, maxOnWire, largest atomic.Int32
}

func (b *batchSpy) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (b *batchSpy) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (b *batchSpy) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if scriptName(cmds[0]) == "" {
			return next(ctx, cmds)
		}
		defer b.onWire.Add(-1)
		raise(&b.maxOnWire, b.onWire.Add(1))
		raise(&b.largest, int32(len(cmds)))
		return next(ctx, cmds)
	}
}

// raise sets a to v if v is larger.
func raise(a *atomic.Int32, v int32) {
	for m := a.Load(); v > m && !a.CompareAndSwap(m, v); m = a.Load() {
	}
}

// TestAutoPipelineBatches: 64 callers at once on one store whose callers
// queue share batches.
func TestAutoPipelineBatches(t *testing.T) {
	t.Parallel()
	c := redistest.Shared(t).Client(t)
	spy := &batchSpy{}
	c.AddHook(spy)
	g := New(batchAsQueued(NewRedisStore(c, WithPrefix(redistest.Prefix(t)), WithAutoPipeline())), quietLog)
	doFreshKeys(t, g, 64, 20)
	require.Greater(t, spy.largest.Load(), int32(1), "the largest batch")
	t.Logf("largest batch %d, at most %d batches on the wire at once", spy.largest.Load(), spy.maxOnWire.Load())
}

// panicHook panics in every pipeline of a store script.
type panicHook struct{}

func (panicHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (panicHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (panicHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if scriptName(cmds[0]) != "" {
			panic("a hook's bug")
		}
		return next(ctx, cmds)
	}
}

// TestAutoPipelinePanic: a panic while a batch is sent (a hook's, on the
// store's goroutine, where no caller can recover it) fails the batch's
// calls with an error instead of the process, and the next batches run.
func TestAutoPipelinePanic(t *testing.T) {
	t.Parallel()
	c := redistest.Shared(t).Client(t)
	c.AddHook(panicHook{})
	s := PipelineEveryCall(NewRedisStore(c, WithPrefix(redistest.Prefix(t)), WithAutoPipeline()))
	ctx := context.Background()
	req := idemstore.ClaimRequest{Owner: "o", Lease: time.Second, TTL: time.Minute}
	for i := range 3 {
		_, err := s.Claim(ctx, fmt.Sprint("k", i), req)
		require.ErrorContains(t, err, "panicked: a hook's bug")
	}
}

// TestAutoPipelineLoneCaller: one caller at a time sends every script
// directly; no batch is ever formed.
func TestAutoPipelineLoneCaller(t *testing.T) {
	t.Parallel()
	c := redistest.Shared(t).Client(t)
	spy := newPipeSpy()
	c.AddHook(spy)
	s := NewRedisStore(c, WithPrefix(redistest.Prefix(t)), WithAutoPipeline())
	g := New(s, quietLog)
	ctx := context.Background()
	for i := range 20 {
		_, err := Do(ctx, g, fmt.Sprint("k", i%10), nil, func(context.Context, *Attempt) (int, error) { return i, nil })
		require.NoError(t, err)
	}
	direct, pipelined, _ := spy.counts()
	require.Empty(t, pipelined)
	// At least: another test may flush the shared server's scripts, and
	// the EVAL that loads one again counts too.
	require.GreaterOrEqual(t, direct["claim"], 20)
	require.GreaterOrEqual(t, direct["complete"], 10)
}

// TestAutoPipelineDeadline: a pipelined call returns by its context's
// deadline, although the server does not answer and the client would wait
// its ReadTimeout (30s here) for the batch; the batch still runs, and a
// call made meanwhile is answered once the server answers again.
func TestAutoPipelineDeadline(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	o := srv.Options()
	o.ReadTimeout, o.MaxRetries = 30*time.Second, -1
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	s := PipelineEveryCall(NewRedisStore(c, WithAutoPipeline()))
	ctx := context.Background()
	req := idemstore.ClaimRequest{Owner: "o", Lease: 30 * time.Second, TTL: time.Minute}
	_, err := s.Claim(ctx, "warm", req) // loads the script, opens the connections
	require.NoError(t, err)

	srv.Pause(t)
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume(t)
		}
	}()
	dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = s.Claim(dctx, "k", req)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = s.Claim(cctx, "k2", req)
	require.ErrorIs(t, err, context.Canceled, "a call whose context ended is not sent")

	// A caller that gave up fails nobody else: a call made while its batch
	// is stalled goes in a batch of its own, answered once the server
	// answers again.
	other := make(chan error, 1)
	go func() {
		_, err := s.Claim(ctx, "k3", req)
		other <- err
	}()
	srv.Resume(t)
	resumed = true
	require.NoError(t, <-other)
	res, err := s.Claim(ctx, "k", idemstore.ClaimRequest{Owner: "o2", Lease: time.Second, TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, idemstore.ClaimBusy, res.Status, "the abandoned claim still ran")
}

// doFreshKeys runs Do on g from workers goroutines at once, each with each
// keys of its own, and fails t on any error.
func doFreshKeys(t *testing.T, g *Guard, workers, each int) {
	t.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				if _, err := Do(ctx, g, fmt.Sprint(w, "-", i), nil, func(context.Context, *Attempt) (int, error) { return i, nil }); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// batchSent tells, by a hook on the client, when a batch of the store's
// scripts goes on the wire.
type batchSent chan struct{}

func (b batchSent) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (b batchSent) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (b batchSent) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if scriptName(cmds[0]) != "" {
			select {
			case b <- struct{}{}:
			default:
			}
		}
		return next(ctx, cmds)
	}
}

// TestAutoPipelineCallerGone: a claim in a batch that Redis does not
// answer ends when its caller gives up, with the caller's error, not at the
// end of the store budget (the call's context ends there, not with the
// caller's: withBudget). The take-back of the claim then waits its write
// timeout before it goes on in the background.
func TestAutoPipelineCallerGone(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	o := srv.Options()
	o.ContextTimeoutEnabled = true
	o.ReadTimeout, o.MaxRetries = 30*time.Second, -1
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	sent := make(batchSent, 1)
	c.AddHook(sent)
	const budget = 20 * time.Second
	g := New(PipelineEveryCall(NewRedisStore(c)), WithStoreTimeout(budget), WithWriteTimeout(100*time.Millisecond), WithLease(time.Second))
	fn := func(context.Context, *Attempt) (int, error) { return 1, nil }
	_, err := Do(context.Background(), g, "warm", nil, fn) // loads the scripts, opens the connections
	require.NoError(t, err)
	for len(sent) > 0 {
		<-sent
	}

	srv.Pause(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := Do(ctx, g, "k", nil, fn)
		done <- err
	}()
	<-sent
	cancel()
	err = <-done
	took := time.Since(start)
	srv.Resume(t)
	require.ErrorIs(t, err, context.Canceled)
	require.Less(t, took, budget/2, "the caller's end ends the wait")
	dctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	require.NoError(t, g.Drain(dctx))
}
