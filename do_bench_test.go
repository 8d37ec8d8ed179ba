package idem_test

import (
	"context"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// BenchmarkDo is the CPU a Do costs its caller, fresh and replayed, with
// no round trip in it: on a store that answers in memory (the engine's own
// work), and on a RedisStore whose commands a go-redis hook answers (AnswerHook: the
// engine's work and the store's: the script call, the record read back).
// A replay's figure is the client's share of the gap to a raw GET.
func BenchmarkDo(b *testing.B) {
	ctx := context.Background()
	req := payment{Amount: 1250, Currency: "EUR"}
	const key = "8e03978e-40d5-43e8-bc93-6894a57f9324"
	fn := func(context.Context, *idem.Attempt) (receipt, error) {
		return receipt{Charge: "ch_3MtwBwLkdIwHu7ix28a3tqPa", Fence: 1}, nil
	}
	// A completed record as Redis holds it, for the replays.
	m := miniredis.RunT(b)
	mc := redis.NewClient(&redis.Options{Addr: m.Addr()})
	b.Cleanup(func() { _ = mc.Close() })
	if _, err := idem.Do(ctx, idem.New(idem.NewRedisStore(mc, idem.WithPrefix("bench"))), key, req, fn); err != nil {
		b.Fatal(err)
	}
	var record string
	for _, k := range m.Keys() {
		if !strings.HasSuffix(k, ":l") {
			record, _ = m.Get(k)
		}
	}
	hooked := func(reply any) *idem.Guard {
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
		b.Cleanup(func() { _ = c.Close() })
		c.AddHook(idem.AnswerHook(reply))
		return idem.New(idem.NewRedisStore(c, idem.WithPrefix("bench")), quiet)
	}
	canned := &cannedStore{}
	cannedReplay := &cannedStore{replay: true}
	if _, err := idem.Do(ctx, idem.New(cannedReplay, quiet), key, req, fn); err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		g      *idem.Guard
		replay bool
	}{
		{"memory/fresh", idem.New(canned, quiet), false},
		{"memory/replay", idem.New(cannedReplay, quiet), true},
		{"redis-hook/fresh", hooked(int64(1)), false},
		{"redis-hook/replay", hooked(record), true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ran := false
				r, err := idem.Do(ctx, tc.g, key, req, func(ctx context.Context, a *idem.Attempt) (receipt, error) {
					ran = true
					return fn(ctx, a)
				})
				if err != nil || r.Fence != 1 || ran == tc.replay {
					b.Fatalf("receipt %+v, err %v, ran %v", r, err, ran)
				}
			}
		})
	}
}
