package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/redis/go-redis/v9"
)

// pipeScale is the share of -duration each auto-pipelining comparison
// measures per variant: it runs up to 7 variants at each of 3 levels.
const pipeScale = 0.5

// pipeGuard returns a Guard on c with its own prefix whose store batches
// concurrent scripts (idem.WithAutoPipeline).
func pipeGuard(c redis.UniversalClient, prefix string) *idem.Guard {
	s := idem.NewRedisStore(c, idem.WithPrefix(prefix), idem.WithAutoPipeline())
	return idem.New(s, idem.WithRetention(retention))
}

// autoPipeliner returns c's blocking auto-pipeliner, for the floor's two
// plain commands sent as a pipelining client would.
func autoPipeliner(c redis.UniversalClient) (*redis.AutoPipeliner, error) {
	switch c := c.(type) {
	case *redis.Client:
		return c.AutoPipeline()
	case *redis.ClusterClient:
		return c.AutoPipeline()
	}
	return nil, fmt.Errorf("no auto-pipeliner for %T", c)
}

// floorOp is the raw floor: SET NX PX to claim, SET PX to store, on cmd
// (a client or its auto-pipeliner).
func floorOp(cmd redis.Cmdable, keys keyer) func(ctx context.Context, w int, seq uint64) error {
	return func(ctx context.Context, w int, seq uint64) error {
		k := "raw:{" + keys.key(w, seq) + "}"
		ok, err := cmd.SetNX(ctx, k+":l", "owner-token-0123456", 30*time.Second).Result()
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("raw SET NX found the key taken")
		}
		return cmd.Set(ctx, k, rawPayload, retention).Err()
	}
}

// doOp is idem.Do on fresh keys.
func doOp(g *idem.Guard, keys keyer) func(ctx context.Context, w int, seq uint64) error {
	return func(ctx context.Context, w int, seq uint64) error {
		_, err := idem.Do(ctx, g, keys.key(w, seq), theReq, func(ctx context.Context, a *idem.Attempt) (payment, error) {
			return thePayment, nil
		})
		return err
	}
}

// pipeFresh returns, on clients made by mk, the raw floor plain and
// auto-pipelined and idem.Do without and with WithAutoPipeline.
func pipeFresh(e *env, tag string, n int, mk func() (redis.UniversalClient, *rtHook), srv func(context.Context) (float64, error)) (raw, rawPipe, do, doPipe *variant, err error) {
	base := "ap-" + e.nonce + "-" + tag
	c1, h1 := mk()
	raw = &variant{name: fmt.Sprintf("raw SET NX PX + SET PX, %d clients", n), clients: n, rt: h1.n, srv: srv, op: floorOp(c1, keyer(base+"-raw"))}
	c2, h2 := mk()
	ap, err := autoPipeliner(c2)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	rawPipe = &variant{name: fmt.Sprintf("raw SET NX PX + SET PX auto-pipelined, %d clients", n), clients: n, rt: h2.n, srv: srv, op: floorOp(ap, keyer(base+"-rawp"))}
	c3, h3 := mk()
	do = &variant{name: fmt.Sprintf("idem.Do fresh, WithoutAutoPipeline, %d clients", n), clients: n, rt: h3.n, srv: srv, op: doOp(plainGuard(c3, base+"-do"), keyer("k"))}
	c4, h4 := mk()
	doPipe = &variant{name: fmt.Sprintf("idem.Do fresh, WithAutoPipeline, %d clients", n), clients: n, rt: h4.n, srv: srv, op: doOp(pipeGuard(c4, base+"-dop"), keyer("k"))}
	return raw, rawPipe, do, doPipe, nil
}

// pipeReplays returns a raw GET and idem.Do replays without and with
// WithAutoPipeline, over the same number of pre-completed keys.
func pipeReplays(e *env, tag string, n int, mk func() (redis.UniversalClient, *rtHook), srv func(context.Context) (float64, error)) (get, replay, replayPipe *variant) {
	base := "ap-" + e.nonce + "-" + tag
	nk := e.cfg.replayKeys
	gc, gh := mk()
	getKeys := make([]string, nk)
	for i := range getKeys {
		getKeys[i] = "raw:{" + base + "-get-" + strconv.Itoa(i) + "}"
	}
	get = &variant{
		name: fmt.Sprintf("raw GET, %d clients", n), clients: n, rt: gh.n, srv: srv,
		setup: func(ctx context.Context) error {
			return populate(ctx, nk, func(ctx context.Context, i int) error { return gc.Set(ctx, getKeys[i], rawPayload, retention).Err() })
		},
		op: func(ctx context.Context, w int, seq uint64) error {
			return gc.Get(ctx, getKeys[(uint64(w)*7919+seq)%uint64(nk)]).Err()
		},
	}
	replayOn := func(name string, g *idem.Guard, h *rtHook) *variant {
		keys := make([]string, nk)
		for i := range keys {
			keys[i] = "replay-" + strconv.Itoa(i)
		}
		var reran atomic.Int64
		fn := func(context.Context, *idem.Attempt) (payment, error) { reran.Add(1); return thePayment, nil }
		return &variant{
			name: name, clients: n, rt: h.n, srv: srv,
			setup: func(ctx context.Context) error {
				err := populate(ctx, nk, func(ctx context.Context, i int) error { _, err := idem.Do(ctx, g, keys[i], theReq, fn); return err })
				reran.Store(0)
				return err
			},
			op: func(ctx context.Context, w int, seq uint64) error {
				_, err := idem.Do(ctx, g, keys[(uint64(w)*7919+seq)%uint64(nk)], theReq, fn)
				if err == nil && reran.Load() > 0 {
					err = errors.New("a replay ran the function again")
				}
				return err
			},
		}
	}
	pc, ph := mk()
	replay = replayOn(fmt.Sprintf("idem.Do replays, WithoutAutoPipeline, %d clients", n), plainGuard(pc, base+"-rp"), ph)
	qc, qh := mk()
	replayPipe = replayOn(fmt.Sprintf("idem.Do replays, WithAutoPipeline, %d clients", n), pipeGuard(qc, base+"-rq"), qh)
	return get, replay, replayPipe
}

// runAutoPipe is the auto-pipelining scenario: fresh Do and replays without
// and with WithAutoPipeline, against the plain two-command floor and the
// same two commands auto-pipelined, at 1, 16 and 64 clients, interleaved
// per level; the middleware with the option; the same on a 3-master
// cluster; duplicates under contention.
func runAutoPipe(ctx context.Context, e *env) error {
	cfg := scaled(e.cfg, pipeScale)
	levels := []int{1, 16, 64}
	if e.cfg.quick {
		levels = []int{1, 16}
	}
	progress("scenario 12: auto-pipelining, clients %v", levels)
	sec := e.rep.section("12. Auto-pipelining: WithAutoPipeline vs the plain floor",
		fmt.Sprintf("Each level runs its fresh variants interleaved in the same rounds, then its replay variants; every variant has its own "+
			"go-redis client (ContextTimeoutEnabled, pool ≥ clients). Auto-pipelined raw floor: the same SET NX PX + SET PX through the "+
			"client's blocking auto-pipeliner. %v per variant in %d rounds. srv µs/op is redis-server's CPU per operation.", cfg.duration, cfg.rounds))
	for _, n := range levels {
		mk := func() (redis.UniversalClient, *rtHook) { return e.client(0, n) }
		raw, rawPipe, do, doPipe, err := pipeFresh(e, fmt.Sprintf("c%d", n), n, mk, e.serverUsec)
		if err != nil {
			return err
		}
		if err := compare(ctx, cfg, fmt.Sprintf("auto-pipelining, fresh, %d clients", n), raw, rawPipe, do, doPipe); err != nil {
			return err
		}
		get, replay, replayPipe := pipeReplays(e, fmt.Sprintf("c%d", n), n, mk, e.serverUsec)
		if err := compare(ctx, cfg, fmt.Sprintf("auto-pipelining, replays, %d clients", n), get, replay, replayPipe); err != nil {
			return err
		}
		sec.pair(raw, rawPipe)
		sec.pair(raw, do)
		sec.pair(raw, doPipe)
		sec.pair(rawPipe, doPipe)
		sec.pair(get, replay)
		sec.pair(get, replayPipe)
		pipeTargets(e, n, raw, do, doPipe, get, replayPipe)
	}
	if err := pipeMiddleware(ctx, e, cfg); err != nil {
		return err
	}
	if err := pipeCluster(ctx, e, cfg, levels[1:]); err != nil {
		return err
	}
	return pipeContention(ctx, e)
}

// pipeTargets records the targets at level n.
func pipeTargets(e *env, n int, raw, do, doPipe, get, replayPipe *variant) {
	switch n {
	case 1:
		p50, base := doPipe.lat.quantile(0.5), do.lat.quantile(0.5)
		x := float64(p50) / float64(base)
		e.rep.maxTarget("auto-pipelining, 1 client: p50 of fresh Do with the option ÷ without", x, 1.1,
			fmt.Sprintf("%.2f× (%s vs %s)", x, fmtDur(p50), fmtDur(base)), "≤ 1.1×")
	case 16:
		e.rep.ratioTarget("auto-pipelining, 16 clients: fresh Do with the option / plain 2-command floor", "pipe c16 fresh", doPipe, raw, 1.2)
		x, f := doPipe.srvUsecPerOp(), raw.srvUsecPerOp()
		e.rep.maxTarget("auto-pipelining, 16 clients: Redis CPU per fresh Do with the option ≤ the plain floor's", x, f,
			fmt.Sprintf("%s µs vs %s µs", fmtF(x, 1), fmtF(f, 1)), "≤ floor")
	case 64:
		e.rep.ratioTarget("auto-pipelining, 64 clients: fresh Do with the option / plain 2-command floor", "pipe c64 fresh", doPipe, raw, 1.6)
		e.rep.ratioTarget("auto-pipelining, 64 clients: Do replays with the option / plain GET", "pipe c64 replay", replayPipe, get, 1.3)
		x, f := doPipe.srvUsecPerOp(), raw.srvUsecPerOp()
		e.rep.maxTarget("auto-pipelining, 64 clients: Redis CPU per fresh Do with the option ≤ the plain floor's", x, f,
			fmt.Sprintf("%s µs vs %s µs", fmtF(x, 1), fmtF(f, 1)), "≤ floor")
	}
}

// pipeMiddleware compares g.Middleware on fresh keys without and with
// WithAutoPipeline, at -clients clients.
func pipeMiddleware(ctx context.Context, e *env, cfg *config) error {
	n := e.cfg.clients
	c1, h1 := e.client(0, n)
	c2, h2 := e.client(0, n)
	plain := newHTTPTarget(e, middleware(plainGuard(c1, "apm-"+e.nonce)), httpRespBody)
	piped := newHTTPTarget(e, middleware(pipeGuard(c2, "apq-"+e.nonce)), httpRespBody)
	bare := newHTTPTarget(e, nil, httpRespBody)
	post := func(t *httpTarget, keys keyer) func(ctx context.Context, w int, seq uint64) error {
		return func(ctx context.Context, w int, seq uint64) error {
			code, err := t.post(ctx, keys.key(w, seq))
			if err == nil && code != http.StatusCreated {
				err = fmt.Errorf("status %d", code)
			}
			return err
		}
	}
	vb := &variant{name: "bare handler", clients: n, srv: e.serverUsec, op: post(bare, keyer("b"))}
	vp := &variant{name: "g.Middleware, fresh keys, WithoutAutoPipeline", clients: n, rt: h1.n, srv: e.serverUsec, op: post(plain, keyer("m"))}
	vq := &variant{name: "g.Middleware, fresh keys, WithAutoPipeline", clients: n, rt: h2.n, srv: e.serverUsec, op: post(piped, keyer("m"))}
	if err := compare(ctx, cfg, "auto-pipelining, middleware", vb, vp, vq); err != nil {
		return err
	}
	sec := e.rep.section("12b. Auto-pipelining: g.Middleware", fmt.Sprintf("%d clients over loopback HTTP, as in section 2.", n))
	sec.pair(vb, vp)
	sec.pair(vb, vq)
	sec.pair(vp, vq)
	return nil
}

// pipeCluster compares fresh Do without and with the option on the
// 3-master cluster, against the plain floor there.
func pipeCluster(ctx context.Context, e *env, cfg *config, levels []int) error {
	if len(e.clusterAddrs) == 0 {
		e.rep.section("12c. Auto-pipelining on a 3-master Redis Cluster", "Skipped: "+e.clusterNote)
		return nil
	}
	sec := e.rep.section("12c. Auto-pipelining on a 3-master Redis Cluster",
		"The cluster of section 5b; srv µs/op is the CPU of the three masters together.")
	srv := e.clusterServerUsec()
	for _, n := range levels {
		mk := func() (redis.UniversalClient, *rtHook) { return e.clusterClient(n) }
		raw, rawPipe, do, doPipe, err := pipeFresh(e, fmt.Sprintf("cl%d", n), n, mk, srv)
		if err != nil {
			return err
		}
		if err := compare(ctx, cfg, fmt.Sprintf("auto-pipelining, cluster, %d clients", n), raw, rawPipe, do, doPipe); err != nil {
			return err
		}
		sec.pair(raw, rawPipe)
		sec.pair(raw, do)
		sec.pair(raw, doPipe)
	}
	return nil
}

// pipeContention hits each of -race-keys keys with -clients goroutines at
// once through a pipelined store and counts the side effects.
func pipeContention(ctx context.Context, e *env) error {
	clients := e.cfg.clients
	c, _ := e.client(0, clients)
	g := pipeGuard(c, "apr-"+e.nonce)
	side := &raceSide{name: "idem.Do, WithAutoPipeline"}
	start := time.Now()
	for k := range e.cfg.raceKeys {
		key := "k" + strconv.Itoa(k)
		contend(ctx, clients, func(ctx context.Context) (ran, busy bool, err error) {
			_, err = idem.Do(ctx, g, key, theReq, func(ctx context.Context, a *idem.Attempt) (payment, error) {
				ran = true
				time.Sleep(e.cfg.effect)
				return thePayment, nil
			})
			if errors.Is(err, idem.ErrInProgress) {
				return false, true, nil
			}
			return ran, false, err
		}, side)
	}
	side.elapsed = time.Since(start)
	progress("  contention with WithAutoPipeline: %d keys, %d requests, %d effects, %d duplicates, %d busy, %d errors",
		side.keys, side.requests, side.effects, side.duplicates, side.busy, side.errs)
	e.rep.exactTarget(fmt.Sprintf("auto-pipelining: duplicate side effects, %d clients × %d keys", clients, side.keys), float64(side.duplicates), 0)
	if side.errs > 0 {
		return fmt.Errorf("contention with WithAutoPipeline: %d errors, first: %w", side.errs, side.firstErr)
	}
	return nil
}
