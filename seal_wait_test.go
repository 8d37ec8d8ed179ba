package idem_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redistest"
)

// TestSealedWaiterIsNotified: a sealed Guard passes its store's
// notifications through. A duplicate waiting for the holder is woken by the
// completion, not by polling (a claim every 50ms, about a dozen over the
// wait below): it sends three claims (refused, refused again once
// subscribed, then the replay), and gets the holder's result, opened.
func TestSealedWaiterIsNotified(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	prefix := redistest.Prefix(t)
	sealer := newSealer(t, "k1", "k1")
	store := func(c *redis.Client) *idem.RedisStore {
		return idem.NewRedisStore(c, idem.WithPrefix(prefix), idem.WithoutAutoPipeline())
	}
	holder := idem.New(store(srv.Client(t)), quiet, idem.WithSealer(sealer))
	wc := srv.Client(t)
	claims := &scriptCalls{first: make(chan struct{})}
	wc.AddHook(claims)
	waiter := idem.New(store(wc), quiet, idem.WithSealer(sealer), idem.WithWait(10*time.Second))

	ctx := context.Background()
	claimed, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	var holderErr error
	wg.Go(func() {
		_, holderErr = idem.Do(ctx, holder, "k", payment{1, "EUR"}, func(context.Context, *idem.Attempt) (receipt, error) {
			close(claimed)
			<-release
			return receipt{Charge: marker}, nil
		})
	})
	<-claimed
	var got receipt
	var waitErr error
	wg.Go(func() {
		got, waitErr = idem.Do(ctx, waiter, "k", payment{1, "EUR"}, func(context.Context, *idem.Attempt) (receipt, error) {
			return receipt{Charge: "second"}, nil
		})
	})
	<-claims.first                     // refused: the waiter waits
	time.Sleep(600 * time.Millisecond) // the wait being measured, not a synchronisation
	close(release)
	wg.Wait()
	require.NoError(t, holderErr)
	require.NoError(t, waitErr)
	require.Equal(t, marker, got.Charge, "the holder's result")
	require.LessOrEqual(t, claims.n.Load(), int32(4), "scripts the waiter sent while it waited")
}

// scriptCalls is a go-redis hook that counts the scripts a client sends
// and closes first once the first has its reply.
type scriptCalls struct {
	n     atomic.Int32
	once  sync.Once
	first chan struct{}
}

func (h *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if strings.HasPrefix(cmd.Name(), "eval") {
			h.n.Add(1)
			h.once.Do(func() { close(h.first) })
		}
		return err
	}
}

func (h *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
