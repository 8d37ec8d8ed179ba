package idem

// Batching stores under duplicates: fn runs once per key, through Do, the
// middleware and Once, on a redis-server and a cluster; scripts flushed
// from the server; the client's own auto-pipeliner.

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

	"github.com/idemkit/idem/internal/redistest"
)

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
			g := New(batchAsQueued(NewRedisStore(c, WithPrefix(redistest.Prefix(t)), WithAutoPipeline())),
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
