package idem_test

import (
	"context"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// printObserver prints how each operation ended; contrib/idemotel turns the
// same events into OpenTelemetry metrics and spans.
type printObserver struct{}

func (printObserver) Start(ctx context.Context, kind idem.Kind) context.Context { return ctx }

func (printObserver) End(_ context.Context, e idem.Event) {
	fmt.Printf("%s %s fence=%d\n", e.Kind, e.Outcome, e.Fence)
}

func ExampleWithObserver() {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	g := idem.New(idem.NewRedisStore(rdb), idem.WithObserver(printObserver{}))

	ctx := context.Background()
	charge := func(context.Context, *idem.Attempt) (string, error) { return "ch_1", nil }
	for range 2 {
		if _, err := idem.Do(ctx, g, "order-42", "pay 10 EUR", charge); err != nil {
			fmt.Println(err)
		}
	}
	_, err := idem.Do(ctx, g, "order-42", "pay 99 EUR", charge)
	fmt.Println(err)
	// Output:
	// do executed fence=1
	// do replayed fence=1
	// do mismatch fence=1
	// idem: key reused with a different request
}
