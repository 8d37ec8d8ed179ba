package idem_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// Many goroutines share one store: with WithAutoPipeline, their claims and
// completions travel to Redis in shared batches. A few callers at a time
// are sent directly and pay no batching delay.
func ExampleWithAutoPipeline() {
	m := miniredis.NewMiniRedis() // in production, your Redis or Redis Cluster
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()

	g := idem.New(idem.NewRedisStore(rdb, idem.WithAutoPipeline()))
	var charged atomic.Int32
	var wg sync.WaitGroup
	for range 32 { // 32 retries of one request, at once
		wg.Go(func() {
			// Each gets the result, or ErrInProgress while the first runs.
			_, _ = idem.Do(context.Background(), g, "order-42", nil, func(ctx context.Context, a *idem.Attempt) (string, error) {
				charged.Add(1)
				return "charged", nil
			})
		})
	}
	wg.Wait()
	fmt.Println("charged", charged.Load(), "time")
	// Output: charged 1 time
}
