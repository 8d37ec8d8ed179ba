package idem

// No call of a batching store waits behind a batch already on the wire,
// and batching is the store's default.

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/redistest"
)

// holdHook holds the first n commands of store scripts (sent alone or in a
// pipeline) before they are written, until release is closed; entered
// receives once per command held.
type holdHook struct {
	mu      sync.Mutex
	n       int
	entered chan struct{}
	release chan struct{}
}

func newHoldHook(n int) *holdHook {
	return &holdHook{n: n, entered: make(chan struct{}, n), release: make(chan struct{})}
}

// hold blocks the caller until release when fewer than n were held.
func (h *holdHook) hold(cmd redis.Cmder) {
	if scriptName(cmd) == "" {
		return
	}
	h.mu.Lock()
	held := h.n > 0
	h.n--
	h.mu.Unlock()
	if held {
		h.entered <- struct{}{}
		<-h.release
	}
}

func (h *holdHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *holdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.hold(cmd)
		return next(ctx, cmd)
	}
}

func (h *holdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.hold(cmds[0])
		return next(ctx, cmds)
	}
}

// TestAutoPipelineNoWaitBehindWire: while calls are held on their way to
// Redis, more than pipeDirect of them, each in a batch of its own or sent
// alone, one more call goes out on a connection of its own and is
// answered; the held ones are answered once let go. For a store whose
// every call rides a batch, and for a default store whose callers queue,
// which sends the first pipeDirect calls in flight directly and then
// gathers batches.
func TestAutoPipelineNoWaitBehindWire(t *testing.T) {
	t.Parallel()
	for _, every := range []bool{true, false} {
		t.Run(fmt.Sprint("every call batched ", every), func(t *testing.T) {
			t.Parallel()
			c := redistest.Shared(t).Client(t)
			const held = pipeDirect + 2
			h := newHoldHook(held)
			c.AddHook(h)
			s := NewRedisStore(c, WithPrefix(redistest.Prefix(t)))
			require.NotNil(t, s.pipe, "batching is the default")
			if every {
				PipelineEveryCall(s)
			} else {
				batchAsQueued(s)
			}
			ctx := context.Background()
			req := idemstore.ClaimRequest{Owner: "o", Lease: 10 * time.Second, TTL: time.Minute}
			errs := make(chan error, held)
			for i := range held {
				go func() {
					_, err := s.Claim(ctx, fmt.Sprint("held-", i), req)
					errs <- err
				}()
				select {
				case <-h.entered:
				case <-time.After(10 * time.Second):
					t.Fatalf("call %d was not sent while %d calls were on the wire", i+1, i)
				}
			}
			res, err := s.Claim(ctx, "free", req)
			require.NoError(t, err)
			require.Equal(t, idemstore.ClaimOK, res.Status)
			close(h.release)
			for range held {
				require.NoError(t, <-errs)
			}
		})
	}
}

// TestAutoPipelineOff: WithoutAutoPipeline sends every call directly, many
// at once too; WithAutoPipeline after it turns batching on again.
func TestAutoPipelineOff(t *testing.T) {
	t.Parallel()
	c := redistest.Shared(t).Client(t)
	spy := newPipeSpy()
	c.AddHook(spy)
	s := NewRedisStore(c, WithPrefix(redistest.Prefix(t)), WithoutAutoPipeline())
	require.Nil(t, s.pipe)
	g := New(s, quietLog)
	doFreshKeys(t, g, 32, 5)
	direct, pipelined, _ := spy.counts()
	require.Empty(t, pipelined)
	require.GreaterOrEqual(t, direct["claim"], 160)

	require.NotNil(t, NewRedisStore(c, WithoutAutoPipeline(), WithAutoPipeline()).pipe)
	require.Nil(t, NewRedisStore(c, WithAutoPipeline(), WithoutAutoPipeline()).pipe)
}
