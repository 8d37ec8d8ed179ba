package idem_test

import (
	"context"
	"sync"
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
	refused := make(chan struct{}) // the waiter's first claim has its reply
	var once sync.Once
	claims := &commandCounter{edit: func(redis.Cmder) { once.Do(func() { close(refused) }) }}
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
	<-refused                          // the waiter waits
	time.Sleep(600 * time.Millisecond) // the wait being measured, not a synchronisation
	close(release)
	wg.Wait()
	require.NoError(t, holderErr)
	require.NoError(t, waitErr)
	require.Equal(t, marker, got.Charge, "the holder's result")
	require.LessOrEqual(t, claims.count("evalsha")+claims.count("eval"), 4, "scripts the waiter sent while it waited")
}
