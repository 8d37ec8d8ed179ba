package main

import (
	"context"
	"fmt"
	"os/exec"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redistest"
)

// BenchmarkRedisDo: idem.Do against a real redis-server, go-redis included:
// the allocations per fresh Do and per replay that issue targets name, and
// a raw GET beside them.
func BenchmarkRedisDo(b *testing.B) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		b.Skip("redis-server not on PATH")
	}
	c := redistest.Shared(b).Client(b)
	g := idem.New(idem.NewRedisStore(c, idem.WithPrefix(redistest.Prefix(b))))
	ctx := context.Background()
	fn := func(ctx context.Context, a *idem.Attempt) (payment, error) { return thePayment, nil }
	b.Run("fresh", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			if _, err := idem.Do(ctx, g, fmt.Sprint("fresh-", i), theReq, fn); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		if _, err := idem.Do(ctx, g, "replay", theReq, fn); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := idem.Do(ctx, g, "replay", theReq, fn); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("raw-GET", func(b *testing.B) {
		k := redistest.Prefix(b) + ":raw"
		c.Set(ctx, k, rawPayload, 0)
		b.ReportAllocs()
		for b.Loop() {
			if err := c.Get(ctx, k).Err(); err != nil && err != redis.Nil {
				b.Fatal(err)
			}
		}
	})
}
