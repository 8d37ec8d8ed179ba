// Command quickstart charges a payment once, although it is sent three times.
package main

import (
	"context"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

func main() {
	mr, _ := miniredis.Run() // an embedded Redis for the demo; use yours in production
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	g := idem.New(idem.NewRedisStore(rdb))

	type Payment struct{ Amount int }
	charges := 0
	charge := func(ctx context.Context, a *idem.Attempt) (string, error) {
		charges++ // the side effect; a.ID is the provider's idempotency key
		return "receipt for " + a.ID, nil
	}
	key := "5f0c7f5e-6b0a-4a4e-9d1e-2b1f3c9a7d10" // made by the client (idemclient.NewKey), sent on every retry
	for range 3 {
		receipt, err := idem.Do(context.Background(), g, key, Payment{1000}, charge)
		fmt.Println(receipt, err)
	}
	fmt.Println("charges:", charges)
}
