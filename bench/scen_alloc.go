package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// Scenario 1b, "allocs": heap allocations per operation measured cleanly,
// the way testing.AllocsPerRun does (one goroutine, GOMAXPROCS 1, the
// runtime's malloc count before and after n runs), against the standalone
// redis-server, go-redis included, on a client with ContextTimeoutEnabled
// as the README recommends (and on go-redis's defaults, for comparison). The
// harness's allocs/op column counts the whole process under concurrency;
// these are the per-call figures the targets are set on.

// allocsPer runs op warm times, then n times with GOMAXPROCS 1, and returns
// the heap allocations per run (testing.AllocsPerRun's method, without its
// rounding down to an integer).
func allocsPer(warm, n int, op func(i int) error) (float64, error) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for i := range warm {
		if err := op(i); err != nil {
			return 0, err
		}
	}
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	for i := range n {
		if err := op(warm + i); err != nil {
			return 0, err
		}
	}
	runtime.ReadMemStats(&b)
	return float64(b.Mallocs-a.Mallocs) / float64(n), nil
}

// allocRow is one line of the allocation table.
type allocRow struct {
	what   string
	allocs float64
	base   string  // the baseline row's what, if any
	over   float64 // allocs - the baseline's
}

// runAllocs is scenario 1b.
func runAllocs(ctx context.Context, e *env) error {
	n := e.cfg.allocRuns
	warm := min(n, 50)
	progress("scenario 1b: allocations per operation, one goroutine, %d runs each", n)
	newClientWith := func(ctxTimeout bool) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: e.redisAddr, PoolSize: 4, ContextTimeoutEnabled: ctxTimeout})
		e.onClose(func() { c.Close() })
		return c
	}
	newClient := func() *redis.Client { return newClientWith(true) }
	c := newClient()
	base := "a-" + e.nonce
	g := e.guard(c, base)
	// go-redis's defaults: a Guard then calls the store on a goroutine of
	// its own, so that the store timeout bounds the call.
	gDef := e.guard(newClientWith(false), base+"-def")
	fn := func(ctx context.Context, a *idem.Attempt) (payment, error) { return thePayment, nil }

	// Keys are made before the measured runs, so that their strings are not counted.
	total := warm + n
	keys := func(prefix string) []string {
		ks := make([]string, total)
		for i := range ks {
			ks[i] = prefix + strconv.Itoa(i)
		}
		return ks
	}
	const replayKeys = 16
	replayIDs := keys("replay-")[:replayKeys]
	getKeys := keys("raw:{" + base + "-get-")[:replayKeys]
	for i := range replayKeys {
		if _, err := idem.Do(ctx, g, replayIDs[i], theReq, fn); err != nil {
			return err
		}
		if _, err := idem.Do(ctx, gDef, replayIDs[i], theReq, fn); err != nil {
			return err
		}
		getKeys[i] += "}"
		if err := c.Set(ctx, getKeys[i], rawPayload, retention).Err(); err != nil {
			return err
		}
	}
	freshIDs := keys("fresh-")
	rawKeys := keys("raw:{" + base + "-raw-")
	luaKeys := keys("lua:{" + base + "-lua-")
	for i := range rawKeys {
		rawKeys[i] += "}"
		luaKeys[i] += "}"
	}
	luaLeases := make([]string, total)
	rawLeases := make([]string, total)
	for i := range luaKeys {
		luaLeases[i], rawLeases[i] = luaKeys[i]+":l", rawKeys[i]+":l"
	}
	luaKS := make([][]string, total)
	for i := range luaKS {
		luaKS[i] = []string{luaKeys[i], luaLeases[i]}
	}
	getKS := make([][]string, replayKeys)
	for i := range getKS {
		getKS[i] = []string{getKeys[i]}
	}
	retMs := retention.Milliseconds()

	var rows []allocRow
	measure := func(what, baseline string, op func(i int) error) (float64, error) {
		x, err := allocsPer(warm, n, op)
		if err != nil {
			return 0, fmt.Errorf("allocations, %s: %w", what, err)
		}
		r := allocRow{what: what, allocs: x, base: baseline}
		for _, b := range rows {
			if b.what == baseline {
				r.over = x - b.allocs
			}
		}
		rows = append(rows, r)
		progress("  %-58s %6.1f allocs/op", what, x)
		return x, nil
	}

	var reran atomic.Int64
	replayFn := func(ctx context.Context, a *idem.Attempt) (payment, error) { reran.Add(1); return thePayment, nil }
	if _, err := measure("raw GET (go-redis)", "", func(i int) error {
		return c.Get(ctx, getKeys[i%replayKeys]).Err()
	}); err != nil {
		return err
	}
	replay, err := measure("idem.Do, replay", "raw GET (go-redis)", func(i int) error {
		_, err := idem.Do(ctx, g, replayIDs[i%replayKeys], theReq, replayFn)
		return err
	})
	if err != nil {
		return err
	}
	bg := context.Background() // never cancelled: the store budget's context is shared
	replayBg, err := measure("idem.Do, replay, a context never cancelled", "raw GET (go-redis)", func(i int) error {
		_, err := idem.Do(bg, g, replayIDs[i%replayKeys], theReq, replayFn)
		return err
	})
	if err != nil {
		return err
	}
	if _, err := measure("idem.Do, replay, go-redis defaults", "raw GET (go-redis)", func(i int) error {
		_, err := idem.Do(ctx, gDef, replayIDs[i%replayKeys], theReq, replayFn)
		return err
	}); err != nil {
		return err
	}
	if reran.Load() != 0 {
		return errors.New("allocations: a replay ran the function again")
	}
	if _, err := measure("minimal Lua read script", "raw GET (go-redis)", func(i int) error {
		return luaRead.Run(ctx, c, getKS[i%replayKeys]).Err()
	}); err != nil {
		return err
	}
	if _, err := measure("raw SET NX PX + SET PX (go-redis)", "", func(i int) error {
		if err := c.SetNX(ctx, rawLeases[i], "owner-token-0123456", 30*time.Second).Err(); err != nil {
			return err
		}
		return c.Set(ctx, rawKeys[i], rawPayload, retention).Err()
	}); err != nil {
		return err
	}
	fresh, err := measure("idem.Do, fresh key", "raw SET NX PX + SET PX (go-redis)", func(i int) error {
		_, err := idem.Do(ctx, g, freshIDs[i], theReq, fn)
		return err
	})
	if err != nil {
		return err
	}
	freshBg := keys("fresh-bg-")
	freshBgAllocs, err := measure("idem.Do, fresh key, a context never cancelled", "raw SET NX PX + SET PX (go-redis)", func(i int) error {
		_, err := idem.Do(bg, g, freshBg[i], theReq, fn)
		return err
	})
	if err != nil {
		return err
	}
	if _, err := measure("idem.Do, fresh key, go-redis defaults", "raw SET NX PX + SET PX (go-redis)", func(i int) error {
		_, err := idem.Do(ctx, gDef, freshIDs[i], theReq, fn)
		return err
	}); err != nil {
		return err
	}
	if _, err := measure("minimal Lua claim + complete scripts", "raw SET NX PX + SET PX (go-redis)", func(i int) error {
		if err := luaClaim.Run(ctx, c, luaKS[i], "owner-token-0123456", 30000, retMs).Err(); err != nil {
			return err
		}
		return luaComplete.Run(ctx, c, luaKS[i], rawPayload, retMs).Err()
	}); err != nil {
		return err
	}

	// The middleware on one goroutine, through ServeHTTP with a recorder:
	// the same request and recorder for the bare handler and behind
	// g.Middleware, so the difference is the middleware's own (go-redis
	// included).
	var effects atomic.Int64
	bare := payHandler(&effects, httpRespBody)
	mwG := e.guard(newClient(), base+"-mw")
	with := middleware(mwG)(payHandler(&effects, httpRespBody))
	mwKeys := make([]string, total)
	for i := range mwKeys {
		mwKeys[i] = httpKey("am", e.nonce, 0, uint64(i))
	}
	serve := func(h http.Handler, key string) error {
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/payments", bytes.NewReader(httpReqBody))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			return fmt.Errorf("status %d", w.Code)
		}
		return nil
	}
	const bareName = "bare handler, ServeHTTP with a recorder"
	if _, err := measure(bareName, "", func(i int) error { return serve(bare, mwKeys[i]) }); err != nil {
		return err
	}
	if _, err := measure("g.Middleware, fresh key", bareName, func(i int) error { return serve(with, mwKeys[i]) }); err != nil {
		return err
	}
	effects0 := effects.Load()
	if _, err := measure("g.Middleware, replay", bareName, func(i int) error { return serve(with, mwKeys[i%replayKeys]) }); err != nil {
		return err
	}
	if effects.Load() != effects0 {
		return errors.New("allocations: a middleware replay ran the handler")
	}

	// The caller's context of the rows without a mark can be cancelled (the
	// benchmark's own), as a request's is: the claim's store budget is then
	// a context of one allocation. An operation allocates a whole number of
	// times; the fraction above it is the process's own in the background
	// (the store budget's timer, a few allocations each 10 ms, shared by the
	// calls), so the targets compare the figure as printed, to a tenth.
	tenth := func(x float64) float64 { return math.Round(x*10) / 10 }
	e.rep.maxTarget("allocations per Do replay, one goroutine, go-redis included", tenth(replay), 12, fmtF(replay, 1), "≤ 12")
	e.rep.maxTarget("allocations per fresh Do, one goroutine, go-redis included", tenth(fresh), 24, fmtF(fresh, 1), "≤ 24")
	e.rep.maxTarget("allocations per Do replay, a context never cancelled, go-redis included", tenth(replayBg), 12, fmtF(replayBg, 1), "≤ 12")
	e.rep.maxTarget("allocations per fresh Do, a context never cancelled, go-redis included", tenth(freshBgAllocs), 24, fmtF(freshBgAllocs, 1), "≤ 24")

	var b strings.Builder
	b.WriteString("| operation | allocs/op | over its baseline |\n|---|---:|---:|\n")
	for _, r := range rows {
		over := "baseline"
		if r.base != "" {
			over = fmt.Sprintf("%+.1f (over %s)", r.over, r.base)
		}
		fmt.Fprintf(&b, "| %s | %.1f | %s |\n", r.what, r.allocs, over)
	}
	e.rep.section("1b. Allocations per operation, one goroutine", fmt.Sprintf(
		"`testing.AllocsPerRun`'s method: %d untimed runs, then %d runs on one goroutine with GOMAXPROCS 1, the runtime's "+
			"malloc count before and after (not rounded down). Against the standalone redis-server with a plain go-redis client "+
			"(no hooks) with ContextTimeoutEnabled, as the README recommends, so go-redis's share is included; the rows marked "+
			"go-redis defaults use a client without it, on which a Guard calls the store on a goroutine of its own (the store timeout). "+
			"The caller's context is the benchmark's, which can be cancelled, as a request's can, except in the rows marked a context "+
			"never cancelled (context.Background(), as a worker's often is), whose store calls share their deadline's context. Keys, key slices and request bodies are built before the runs; replays cycle "+
			"over %d completed keys. The middleware rows call ServeHTTP with an `httptest` request and recorder, built the same way "+
			"for the bare handler, so their difference is what g.Middleware adds (the HTTP stack itself is not in these rows; §7b "+
			"measures the middleware over loopback TCP, whole process, 16 clients).", warm, n, replayKeys)).body = b.String()
	return nil
}
