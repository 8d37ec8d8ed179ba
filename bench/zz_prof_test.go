package main

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func BenchmarkZZFreshParallel(b *testing.B) {
	o := redistest.Shared(b).Client(b).Options()
	o.ContextTimeoutEnabled = true
	c := redis.NewClient(o)
	g := idem.New(idem.NewRedisStore(c, idem.WithPrefix(redistest.Prefix(b))))
	ctx := context.Background()
	fn := func(ctx context.Context, a *idem.Attempt) (payment, error) { return thePayment, nil }
	var n atomic.Int64
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := idem.Do(ctx, g, "f"+strconv.FormatInt(n.Add(1), 10), theReq, fn); err != nil {
				b.Fatal(err)
			}
		}
	})
}
