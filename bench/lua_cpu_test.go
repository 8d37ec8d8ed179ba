package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/internal/redistest"
)

// TestLuaCPU measures redis-server's CPU per operation (INFO cpu, user +
// sys) for the scripts in ../lua against the smallest scripts that could do
// the job (the reference of the differences), plain commands and, on
// request, other versions of the scripts (an earlier commit's lua/, checked
// out with git worktree): a fresh operation (claim on a new key, then
// complete) and a replay (claim on a completed record). The variants
// alternate round by round on one dedicated server, 16 clients on loopback,
// so that every variant sees the same machine. Opt in, it takes about a
// minute:
//
//	IDEM_LUA_CPU=1 go test -run TestLuaCPU -v .
//
// IDEM_LUA_CPU_ROUNDS (default 6) and IDEM_LUA_CPU_OPS (default 20000 per
// variant per round) size the run; IDEM_LUA_CPU_PIPE=n sends the ops in
// pipelines of n; IDEM_LUA_CPU_DIRS=name=dir,... adds script directories
// (claim.lua and complete.lua) to compare, IDEM_LUA_CPU_ONLY=name,... keeps
// only the variants named (minimal among them).
func TestLuaCPU(t *testing.T) {
	if os.Getenv("IDEM_LUA_CPU") == "" {
		t.Skip("set IDEM_LUA_CPU=1 to measure")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not on PATH")
	}
	rounds, ops := envInt("IDEM_LUA_CPU_ROUNDS", 6), envInt("IDEM_LUA_CPU_OPS", 20000)
	pipe := envInt("IDEM_LUA_CPU_PIPE", 1)
	ctx := context.Background()
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 32})
	t.Cleanup(func() { c.Close() })

	dirs := [][2]string{{"lua", "../lua"}}
	for _, d := range strings.Split(os.Getenv("IDEM_LUA_CPU_DIRS"), ",") {
		if name, dir, ok := strings.Cut(d, "="); ok {
			dirs = append(dirs, [2]string{name, dir})
		}
	}
	minClaim := redis.NewScript(`redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[3])
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[4])
return 1`)
	minComplete := redis.NewScript(`redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('DEL', KEYS[2])
return 1`)
	minRead := redis.NewScript(`return redis.call('GET', KEYS[1])`)

	const owner, fp = "Tq3xW9aB", "kX0f3vQm2pLr8sYt1uBn4w" // newToken, fingerprint sizes
	payload := string(rawPayload)
	variants := []luaVariant{
		{name: "plain",
			fresh: func(c redis.Cmdable, k luaKeys) error {
				if err := c.SetNX(ctx, k.lease, owner, 30*time.Second).Err(); err != nil {
					return err
				}
				return c.Set(ctx, k.rec, "1P|1|"+owner+"|"+fp+"|1700000000|", 86430*time.Second).Err()
			},
			replay: func(c redis.Cmdable, k luaKeys) error { return c.Get(ctx, k.rec).Err() }},
		{name: "minimal",
			fresh: func(c redis.Cmdable, k luaKeys) error {
				if err := minClaim.Run(ctx, c, k.both(), owner, fp, 30000, 86430000).Err(); err != nil {
					return err
				}
				return minComplete.Run(ctx, c, k.both(), owner, payload, 86400000).Err()
			},
			replay: func(c redis.Cmdable, k luaKeys) error { return minRead.Run(ctx, c, k.both()).Err() }},
	}
	for _, d := range dirs {
		claim, complete := readScript(t, d[1], "claim.lua"), readScript(t, d[1], "complete.lua")
		// A script that reads ARGV[7] (the other fingerprints) takes the
		// creation time from the caller, in ARGV[6]; an older one calls
		// TIME.
		claimArgs := func() []any { return []any{owner, fp, 30000, 86430000, "0"} }
		switch {
		case strings.Contains(claim.src, "ARGV[1]  the record this claim creates"):
			// The caller builds the record of a fresh key, and sends no flag
			// without replica acks.
			claimArgs = func() []any {
				return []any{fmt.Sprintf("1P|1|%s|%s|%d|", owner, fp, time.Now().Unix()), owner, 30000, 86430000}
			}
		case strings.Contains(claim.src, "ARGV[7]"):
			claimArgs = func() []any {
				return []any{owner, fp, 30000, 86430000, "0", time.Now().Unix()}
			}
		}
		variants = append(variants, luaVariant{name: d[0],
			// In a pipeline (IDEM_LUA_CPU_PIPE), replies are checked only
			// by the warm-up, which runs without.
			fresh: func(c redis.Cmdable, k luaKeys) error {
				_, piped := c.(redis.Pipeliner)
				v, err := claim.s.Run(ctx, c, k.both(), claimArgs()...).Result()
				if a, _ := v.([]any); !piped && err == nil && v != int64(1) && (len(a) != 3 || a[0] != int64(1)) {
					err = fmt.Errorf("claim: %v", v)
				}
				if err != nil && !piped {
					return err
				}
				n, err := complete.s.Run(ctx, c, k.both(), owner, payload, 86400000, "=").Int64()
				if !piped && err == nil && n != 1 {
					err = fmt.Errorf("complete: %d", n)
				}
				if piped {
					return nil
				}
				return err
			},
			replay: func(c redis.Cmdable, k luaKeys) error {
				_, piped := c.(redis.Pipeliner)
				v, err := claim.s.Run(ctx, c, k.both(), claimArgs()...).Result()
				if _, ok := v.(string); !ok && err == nil && !piped {
					err = fmt.Errorf("replay: %v", v)
				}
				if piped {
					return nil
				}
				return err
			}})
	}

	if only := os.Getenv("IDEM_LUA_CPU_ONLY"); only != "" {
		names := strings.Split(only, ",")
		variants = slices.DeleteFunc(variants, func(v luaVariant) bool { return !slices.Contains(names, v.name) })
	}

	// Replays read these completed records, written as format 1.
	const nrec = 512
	replayKeys := make([]luaKeys, nrec)
	for i := range replayKeys {
		replayKeys[i] = newLuaKeys("idem:{replay-" + strconv.Itoa(i) + "}")
	}
	populateReplays := func() {
		for _, k := range replayKeys {
			if err := c.Set(ctx, k.rec, "1C|1|"+owner+"|"+fp+"|1700000000|="+payload, 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}

	type sample struct{ fresh, replay []float64 }
	res := make([]sample, len(variants))
	var seq atomic.Int64
	for r := range rounds {
		// Start every round on an empty keyspace: fresh keys would grow the
		// main dictionary, and its rehashing would land on whichever variant
		// runs then.
		if err := c.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		populateReplays()
		for j := range variants {
			v := &variants[(j+r)%len(variants)] // rotate the order every round
			i := (j + r) % len(variants)
			fresh := measure(t, ctx, c, ops, pipe, func(c redis.Cmdable, _ int) error {
				return v.fresh(c, newLuaKeys("idem:{f-"+strconv.FormatInt(seq.Add(1), 10)+"}"))
			})
			replay := measure(t, ctx, c, ops, pipe, func(c redis.Cmdable, n int) error { return v.replay(c, replayKeys[n%nrec]) })
			res[i].fresh = append(res[i].fresh, fresh)
			res[i].replay = append(res[i].replay, replay)
		}
	}
	t.Logf("server µs per op, %d rounds × %d ops, mean ± standard error (median)", rounds, ops)
	t.Logf("and the difference to the smallest scripts, round by round")
	t.Logf("%-10s %-24s %-24s %-24s %-24s", "variant", "fresh", "replay", "fresh-minimal", "replay-minimal")
	base := max(slices.IndexFunc(variants, func(v luaVariant) bool { return v.name == "minimal" }), 0)
	for i, v := range variants {
		t.Logf("%-10s %-24s %-24s %-24s %-24s", v.name, stat(res[i].fresh), stat(res[i].replay),
			stat(diff(res[i].fresh, res[base].fresh)), stat(diff(res[i].replay, res[base].replay)))
	}
}

func diff(a, b []float64) []float64 {
	d := make([]float64, len(a))
	for i := range a {
		d[i] = a[i] - b[i]
	}
	return d
}

type luaVariant struct {
	name          string
	fresh, replay func(redis.Cmdable, luaKeys) error
}

type luaKeys struct{ rec, lease string }

func newLuaKeys(rec string) luaKeys { return luaKeys{rec, rec + ":l"} }

func (k luaKeys) both() []string { return []string{k.rec, k.lease} }

type luaScript struct {
	src string
	s   *redis.Script
}

func readScript(t *testing.T, dir, name string) luaScript {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return luaScript{string(b), redis.NewScript(string(b))}
}

// measure runs op n times on 16 goroutines, in pipelines of pipe ops, and
// returns redis-server's CPU per op in µs. Pipelines leave out most of the
// socket I/O, which is the same for every script and the noisiest part.
func measure(t *testing.T, ctx context.Context, c *redis.Client, n, pipe int, op func(c redis.Cmdable, i int) error) float64 {
	t.Helper()
	// Load the scripts, check their replies and warm the connections
	// outside the measurement.
	for i := range 16 {
		if err := op(c, n+i); err != nil {
			t.Fatal(err)
		}
	}
	cpu0, err := serverCPU(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(int64(pipe)) - int64(pipe))
				if i >= n {
					return
				}
				var err error
				if pipe == 1 {
					err = op(c, i)
				} else {
					_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
						for j := i; j < min(i+pipe, n); j++ {
							_ = op(p, j)
						}
						return nil
					})
				}
				if err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	cpu1, err := serverCPU(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}
	return (cpu1 - cpu0) / float64(n)
}

func stat(xs []float64) string {
	var sum float64
	for _, x := range xs {
		sum += x
	}
	mean := sum / float64(len(xs))
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	se := 0.0
	if len(xs) > 1 {
		se = math.Sqrt(ss/float64(len(xs)-1)) / math.Sqrt(float64(len(xs)))
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return fmt.Sprintf("%5.2f ± %4.2f (%5.2f)", mean, se, s[len(s)/2])
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}
