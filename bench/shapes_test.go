package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redistest"
)

// BenchmarkReplayShapes compares command shapes for a replay on a real
// redis-server: a plain GET (the floor), idem's claim script as it runs
// (EVALSHA on a completed record), the same script as a Redis Function
// (FCALL), and the smallest read script. Run with -count and benchstat:
// the sub-benchmarks alternate, so every shape sees the same machine.
// srv-µs/op is redis-server's CPU per operation (INFO cpu).
func BenchmarkReplayShapes(b *testing.B) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		b.Skip("redis-server not on PATH")
	}
	src, err := os.ReadFile("../lua/claim.lua")
	if err != nil {
		b.Skip("lua/claim.lua not found: run from bench/")
	}
	ctx := context.Background()
	srv := redistest.Shared(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 32})
	b.Cleanup(func() { c.Close() })
	prefix := redistest.Prefix(b)
	store := idem.NewRedisStore(c, idem.WithPrefix(prefix))
	g := idem.New(store)
	const n = 512
	type rec struct{ key, lease, fp string }
	recs := make([]rec, n)
	for i := range recs {
		k := fmt.Sprint("shape-", i)
		if _, err := idem.Do(ctx, g, k, theReq, func(context.Context, *idem.Attempt) (payment, error) { return thePayment, nil }); err != nil {
			b.Fatal(err)
		}
		id := idem.OperationID(idem.KindDo, "", k)
		r, err := store.Read(ctx, id)
		if err != nil || r == nil {
			b.Fatal(err)
		}
		recs[i] = rec{key: prefix + ":{" + id + "}", lease: prefix + ":{" + id + "}:l", fp: r.Fingerprint}
	}
	claim := redis.NewScript(string(src))
	read := redis.NewScript("return redis.call('GET', KEYS[1])")
	lib := "#!lua name=idembench\nlocal function claim(KEYS, ARGV)\n" + string(src) + "\nend\nredis.register_function('idembench_claim', claim)\n"
	if err := c.FunctionLoadReplace(ctx, lib).Err(); err != nil {
		b.Fatal(err)
	}
	shapes := []struct {
		name string
		do   func(r rec) error
	}{
		{"GET", func(r rec) error { return c.Get(ctx, r.key).Err() }},
		{"claim-EVALSHA", func(r rec) error {
			return claim.Run(ctx, c, []string{r.key, r.lease}, "o", r.fp, 30000, 86430000, "0").Err()
		}},
		{"claim-FCALL", func(r rec) error {
			return c.FCall(ctx, "idembench_claim", []string{r.key, r.lease}, "o", r.fp, 30000, 86430000, "0").Err()
		}},
		{"read-EVALSHA", func(r rec) error { return read.Run(ctx, c, []string{r.key}).Err() }},
	}
	for _, s := range shapes {
		b.Run(s.name, func(b *testing.B) {
			cpu0, err := serverCPU(ctx, c)
			if err != nil {
				b.Fatal(err)
			}
			b.SetParallelism(8) // 16 goroutines on 2 cores
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					i++
					if err := s.do(recs[i%n]); err != nil {
						b.Error(err)
						return
					}
				}
			})
			cpu1, err := serverCPU(ctx, c)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric((cpu1-cpu0)/float64(b.N), "srv-µs/op")
		})
	}
}
