package idem

// WithAutoPipeline on a real redis-server and a real cluster: what rides
// the store's batches, what does not, and that duplicates still run once.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
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
// ride one, lone calls too, as though pipeDirect other calls were always
// in flight. For tests of package idem_test.
func PipelineEveryCall(s *RedisStore) *RedisStore {
	if s != nil && s.pipe != nil {
		s.pipe.inFlight.Add(pipeDirect)
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

// TestAutoPipelineBatches: 64 callers at once on one store share batches,
// and at most pipeSlots of them are on the wire at any moment.
func TestAutoPipelineBatches(t *testing.T) {
	t.Parallel()
	c := redistest.Shared(t).Client(t)
	spy := &batchSpy{}
	c.AddHook(spy)
	g := New(NewRedisStore(c, WithPrefix(redistest.Prefix(t)), WithAutoPipeline()), quietLog)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 64 {
		wg.Go(func() {
			for i := range 20 {
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
	require.LessOrEqual(t, spy.maxOnWire.Load(), int32(pipeSlots), "batches on the wire at once")
	require.Greater(t, spy.largest.Load(), int32(pipeSecond), "the largest batch")
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

// TestAutoPipelineDuplicates: 64 duplicates of one key and traffic on
// other keys, all at once through one pipelined store, on a redis-server
// and on a cluster: fn runs once per key, every duplicate gets its result,
// and the scripts did share batches. Lease renewals never ride a batch.
func TestAutoPipelineDuplicates(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		client func(t *testing.T) (redis.UniversalClient, func(redis.Hook))
	}{
		{"redis-server", func(t *testing.T) (redis.UniversalClient, func(redis.Hook)) {
			c := redistest.Shared(t).Client(t)
			return c, c.AddHook
		}},
		{"cluster", func(t *testing.T) (redis.UniversalClient, func(redis.Hook)) {
			c := redistest.SharedCluster(t).Client(t)
			return c, func(h redis.Hook) {
				c.OnNewNode(func(n *redis.Client) { n.AddHook(h) })
				_ = c.ForEachShard(context.Background(), func(_ context.Context, n *redis.Client) error { n.AddHook(h); return nil })
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, addHook := tc.client(t)
			spy := newPipeSpy()
			addHook(spy)
			// A lease short enough that the slow fns renew it.
			g := New(NewRedisStore(c, WithPrefix(redistest.Prefix(t)), WithAutoPipeline()),
				quietLog, WithLease(time.Second), WithWait(10*time.Second))
			runs := runDuplicates(t, g, 8)
			for k, n := range runs {
				require.Equal(t, int32(1), n, "key %s", k)
			}
			direct, pipelined, shared := spy.counts()
			require.Positive(t, shared, "no batch of two scripts or more: %v %v", direct, pipelined)
			require.Zero(t, pipelined["heartbeat"], "a renewal rode a batch")
			require.Positive(t, direct["heartbeat"], "the slow fns renewed their leases")
			// However many calls are in flight.
			joined, _ := g.store.(*RedisStore).pipe.join(heartbeatScript)
			require.False(t, joined, "a renewal goes to the client")
		})
	}
}

// runDuplicates calls Do on keys keys at once, from 64 goroutines on the
// first and 8 on each other, with fns that outlive a heartbeat on every
// other key, and returns how often fn ran per key.
func runDuplicates(t *testing.T, g *Guard, keys int) map[string]int32 {
	t.Helper()
	runs := make([]atomic.Int32, keys)
	ctx := context.Background()
	errs := make(chan error, 64+8*keys)
	var wg sync.WaitGroup
	for k := range keys {
		dups := 8
		if k == 0 {
			dups = 64
		}
		for range dups {
			wg.Go(func() {
				v, err := Do(ctx, g, fmt.Sprint("dup-", k), nil, func(ctx context.Context, a *Attempt) (int, error) {
					runs[k].Add(1)
					if k%2 == 0 {
						time.Sleep(450 * time.Millisecond) // past the first renewal (lease/3)
					}
					return k, nil
				})
				if err == nil && v != k {
					err = fmt.Errorf("key %d: got %d", k, v)
				}
				errs <- err
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	out := map[string]int32{}
	for k := range runs {
		out[fmt.Sprint("dup-", k)] = runs[k].Load()
	}
	return out
}

// TestAutoPipelineScriptFlush: a server that lost its scripts answers the
// pipelined EVALSHAs with NOSCRIPT; each is sent again with EVAL, through
// the store's batches, and every call succeeds.
func TestAutoPipelineScriptFlush(t *testing.T) {
	t.Parallel()
	c := redistest.Start(t).Client(t) // its own: the test counts EVALs
	spy := newPipeSpy()
	c.AddHook(spy)
	s := PipelineEveryCall(NewRedisStore(c, WithAutoPipeline()))
	g := New(s, quietLog)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Go(func() {
			v, err := Do(ctx, g, fmt.Sprint("k", i), nil, func(context.Context, *Attempt) (int, error) { return i, nil })
			if err == nil && v != i {
				err = fmt.Errorf("got %d, want %d", v, i)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	direct, pipelined, _ := spy.counts()
	require.NotEmpty(t, pipelined, "no script rode a batch")
	require.GreaterOrEqual(t, direct["claim"]+pipelined["claim"], 17, "16 claims and an EVAL at least: %v %v", direct, pipelined)
	require.GreaterOrEqual(t, direct["complete"]+pipelined["complete"], 17, "16 completions and an EVAL at least: %v %v", direct, pipelined)
	require.GreaterOrEqual(t, spy.evalCount(), 2, "the scripts were loaded again")
}

// TestAutoPipelineClientPipeliner: the client's own auto-pipeliner, closed
// by the application between calls, changes nothing for the store.
func TestAutoPipelineClientPipeliner(t *testing.T) {
	t.Parallel()
	c := redistest.Shared(t).Client(t)
	g := New(PipelineEveryCall(NewRedisStore(c, WithPrefix(redistest.Prefix(t)), WithAutoPipeline())), quietLog)
	ctx := context.Background()
	for i := range 3 {
		v, err := Do(ctx, g, fmt.Sprint("k", i), nil, func(context.Context, *Attempt) (int, error) { return i, nil })
		require.NoError(t, err)
		require.Equal(t, i, v)
		ap, err := c.AutoPipeline()
		require.NoError(t, err)
		require.NoError(t, ap.Close())
	}
}

// TestAutoPipelineMiddlewareAndOnce: 64 duplicate HTTP requests and 64
// duplicate messages through one pipelined store: one handler run, one
// message processed, every duplicate answered alike.
func TestAutoPipelineMiddlewareAndOnce(t *testing.T) {
	t.Parallel()
	c := redistest.Shared(t).Client(t)
	g := New(NewRedisStore(c, WithPrefix(redistest.Prefix(t)), WithAutoPipeline()), quietLog, WithWait(5*time.Second))
	var handled, processed atomic.Int32
	h := g.Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handled.Add(1)
		time.Sleep(20 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("charged"))
	}))
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 128)
	for range 64 {
		wg.Go(func() {
			req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":1}`))
			req.Header.Set("Idempotency-Key", "pay-1")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusCreated || rec.Body.String() != "charged" {
				errs <- fmt.Errorf("got %d %q", rec.Code, rec.Body.String())
			}
		})
		wg.Go(func() {
			if _, err := g.Once(ctx, "msg-1", func(context.Context) error { processed.Add(1); return nil }); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int32(1), handled.Load())
	require.Equal(t, int32(1), processed.Load())
}

// TestAutoPipelineDeadline: a pipelined call returns by its context's
// deadline, although the server does not answer and the client would wait
// its ReadTimeout (30s here) for the batch; the batch still runs, and the
// calls queued behind it are answered.
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

	// A caller that gave up fails nobody else: a call queued behind the
	// stalled batch is answered once the server answers again.
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
