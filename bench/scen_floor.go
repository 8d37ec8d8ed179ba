package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/redis/go-redis/v9"
)

// floorVariants returns the four variants of the floor comparison on one
// client setup: raw two-round-trip claim+store vs Do on fresh keys, and raw
// GET vs Do replays. mk makes a counted client (with or without delay).
func floorVariants(e *env, tag string, clients int, mk func() (redis.UniversalClient, *rtHook), srv func(context.Context) (float64, error)) (raw, fresh, get, replay *variant) {
	base := "b-" + e.nonce + "-" + tag

	rc, rh := mk()
	rawKeys := keyer(base + "-raw")
	raw = &variant{
		name: "raw SET NX PX + SET PX", clients: clients, rt: rh.n, hook: rh, srv: srv,
		op: func(ctx context.Context, w int, seq uint64) error {
			k := "raw:{" + rawKeys.key(w, seq) + "}"
			ok, err := rc.SetNX(ctx, k+":l", "owner-token-0123456", 30*time.Second).Result()
			if err != nil {
				return err
			}
			if !ok {
				return errors.New("raw SET NX found the key taken")
			}
			return rc.Set(ctx, k, rawPayload, retention).Err()
		},
	}

	fresh = freshDoVariant(e, "idem.Do, fresh keys", base+"-do", clients, mk, srv)

	n := e.cfg.replayKeys
	gc, gh := mk()
	getKeys := make([]string, n)
	for i := range getKeys {
		getKeys[i] = "raw:{" + base + "-get-" + strconv.Itoa(i) + "}"
	}
	get = &variant{
		name: "raw GET", clients: clients, rt: gh.n, hook: gh, srv: srv, keys: getKeys,
		setup: func(ctx context.Context) error {
			return populate(ctx, n, func(ctx context.Context, i int) error {
				return gc.Set(ctx, getKeys[i], rawPayload, retention).Err()
			})
		},
		op: func(ctx context.Context, w int, seq uint64) error {
			b, err := gc.Get(ctx, getKeys[(uint64(w)*7919+seq)%uint64(n)]).Bytes()
			if err == nil && len(b) != len(rawPayload) {
				err = errors.New("raw GET: wrong value")
			}
			return err
		},
	}

	replay = replayDoVariant(e, "idem.Do, replays", base+"-replay", clients, mk, srv)
	return raw, fresh, get, replay
}

// replayDoVariant returns idem.Do replaying completed keys, on a client made
// by mk, its store made with opts.
func replayDoVariant(e *env, name, prefix string, clients int, mk func() (redis.UniversalClient, *rtHook), srv func(context.Context) (float64, error), opts ...idem.RedisOption) *variant {
	n := e.cfg.replayKeys
	pc, ph := mk()
	pg := floorGuard(pc, prefix, opts...)
	replayKeys := make([]string, n)
	for i := range replayKeys {
		replayKeys[i] = "replay-" + strconv.Itoa(i)
	}
	var reran atomic.Int64
	return &variant{
		name: name, clients: clients, rt: ph.n, hook: ph, srv: srv,
		setup: func(ctx context.Context) error {
			return populate(ctx, n, func(ctx context.Context, i int) error {
				_, err := idem.Do(ctx, pg, replayKeys[i], theReq, func(ctx context.Context, a *idem.Attempt) (payment, error) {
					return thePayment, nil
				})
				return err
			})
		},
		op: func(ctx context.Context, w int, seq uint64) error {
			p, err := idem.Do(ctx, pg, replayKeys[(uint64(w)*7919+seq)%uint64(n)], theReq, func(ctx context.Context, a *idem.Attempt) (payment, error) {
				reran.Add(1)
				return thePayment, nil
			})
			if err == nil && p.ID != thePayment.ID {
				err = fmt.Errorf("replay returned %+v", p)
			}
			if err == nil && reran.Load() > 0 {
				err = errors.New("replay ran the function again")
			}
			return err
		},
	}
}

// floorGuard returns a Guard on c with its own key prefix, its store made
// with opts (e.guard's, with store options).
func floorGuard(c redis.UniversalClient, prefix string, opts ...idem.RedisOption) *idem.Guard {
	return idem.New(idem.NewRedisStore(c, append([]idem.RedisOption{idem.WithPrefix(prefix)}, opts...)...), idem.WithRetention(retention))
}

// freshDoVariant returns idem.Do on fresh keys, on a client made by mk,
// its store made with opts.
func freshDoVariant(e *env, name, prefix string, clients int, mk func() (redis.UniversalClient, *rtHook), srv func(context.Context) (float64, error), opts ...idem.RedisOption) *variant {
	c, h := mk()
	g := floorGuard(c, prefix, opts...)
	keys := keyer("fresh")
	return &variant{
		name: name, clients: clients, rt: h.n, hook: h, srv: srv,
		op: func(ctx context.Context, w int, seq uint64) error {
			_, err := idem.Do(ctx, g, keys.key(w, seq), theReq, func(ctx context.Context, a *idem.Attempt) (payment, error) {
				return thePayment, nil
			})
			return err
		},
	}
}

// Minimal Lua versions of the two-round-trip design: what any design built on
// Redis scripts pays at least (script call overhead), without idem's record
// format, fingerprint check, fencing or checkpoints.
var (
	luaClaim = redis.NewScript(`if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('SET', KEYS[1], 'P', 'PX', ARGV[3])
  return 1
end
return 0`)
	luaComplete = redis.NewScript(`redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('DEL', KEYS[2])
return 1`)
	luaRead = redis.NewScript(`local v = redis.call('GET', KEYS[1])
if v then return v end
return {1}`)
)

// luaFloorVariants returns the minimal-Lua fresh and replay variants.
func luaFloorVariants(e *env, tag string, clients int, mk func() (redis.UniversalClient, *rtHook), srv func(context.Context) (float64, error), getKeys []string) (fresh, replay *variant) {
	base := "b-" + e.nonce + "-" + tag
	fc, fh := mk()
	keys := keyer(base + "-lua")
	fresh = &variant{
		name: "minimal Lua claim + complete scripts", clients: clients, rt: fh.n, hook: fh, srv: srv,
		op: func(ctx context.Context, w int, seq uint64) error {
			k := "lua:{" + keys.key(w, seq) + "}"
			ks := []string{k, k + ":l"}
			n, err := luaClaim.Run(ctx, fc, ks, "owner-token-0123456", 30000, retention.Milliseconds()).Int()
			if err != nil {
				return err
			}
			if n != 1 {
				return errors.New("minimal Lua claim found the key taken")
			}
			return luaComplete.Run(ctx, fc, ks, rawPayload, retention.Milliseconds()).Err()
		},
	}
	rc, rh := mk()
	n := uint64(len(getKeys))
	replay = &variant{
		name: "minimal Lua read script", clients: clients, rt: rh.n, hook: rh, srv: srv,
		op: func(ctx context.Context, w int, seq uint64) error {
			v, err := luaRead.Run(ctx, rc, []string{getKeys[(uint64(w)*7919+seq)%n]}).Result()
			if _, ok := v.(string); err == nil && !ok {
				err = errors.New("minimal Lua read: key absent")
			}
			return err
		},
	}
	return fresh, replay
}

// runFloor is scenario 1: the physical floor, bare loopback and with a
// simulated network delay per round trip.
func runFloor(ctx context.Context, e *env) error {
	runs := []struct {
		delay   time.Duration
		clients int
	}{{0, e.cfg.clients}, {e.cfg.delay, 1}, {e.cfg.delay, e.cfg.clients}}
	for _, r := range runs {
		d, clients := r.delay, r.clients
		tag := fmt.Sprintf("loop%d", clients)
		title := fmt.Sprintf("bare loopback, %d clients", clients)
		short := fmt.Sprintf("loopback c%d", clients)
		var srv func(context.Context) (float64, error)
		// The targets: on bare loopback (CPU-bound: client and server share
		// the cores) fresh ≥ 0.85× the raw floor and replays ≥ 0.90× a raw
		// GET; with the simulated round trip both ≥ 0.95× at 1 client and
		// ≥ 0.88× at 16.
		freshT, replayT := 0.85, 0.90
		if d == 0 {
			srv = e.serverUsec
		} else {
			tag = fmt.Sprintf("delay%d", clients)
			title = fmt.Sprintf("%v simulated delay per round trip, %d clients", d, clients)
			short = fmt.Sprintf("%v delay c%d", d, clients)
			freshT, replayT = 0.88, 0.88
			if clients == 1 {
				freshT, replayT = 0.95, 0.95
			}
		}
		progress("scenario 1: floor, %s", title)
		mk := func() (redis.UniversalClient, *rtHook) { return e.client(d, clients) }
		raw, fresh, get, replay := floorVariants(e, tag, clients, mk, srv)
		fvs, rvs := []*variant{raw, fresh}, []*variant{get, replay}
		var luaFresh, luaReplay, defFresh, plainFresh, plainReplay *variant
		if d == 0 || clients == 1 {
			// The least any script-based design pays, beside idem: on
			// loopback, and for one request behind the round trip.
			luaFresh, luaReplay = luaFloorVariants(e, tag, clients, mk, srv, get.keys)
			fvs, rvs = append(fvs, luaFresh), append(rvs, luaReplay)
		}
		if d == 0 {
			// Batching is on by default; these rows send every script as
			// a command of its own, the path a lone caller takes.
			plainFresh = freshDoVariant(e, "idem.Do, fresh keys, without batching (WithoutAutoPipeline)", "b-"+e.nonce+"-"+tag+"-doplain",
				clients, mk, srv, idem.WithoutAutoPipeline())
			plainReplay = replayDoVariant(e, "idem.Do, replays, without batching (WithoutAutoPipeline)", "b-"+e.nonce+"-"+tag+"-replayplain",
				clients, mk, srv, idem.WithoutAutoPipeline())
			fvs, rvs = append(fvs, plainFresh), append(rvs, plainReplay)
			// Every other client here sets ContextTimeoutEnabled, as the
			// README recommends; this row shows what go-redis defaults cost:
			// the completion then runs on a goroutine of its own.
			defaults := func() (redis.UniversalClient, *rtHook) { return e.clientWith(d, clients, false) }
			defFresh = freshDoVariant(e, "idem.Do, fresh keys, go-redis defaults (no ContextTimeoutEnabled)", "b-"+e.nonce+"-"+tag+"-dodef", clients, defaults, srv)
			fvs = append(fvs, defFresh)
		}
		if err := compare(ctx, e.cfg, title+" (fresh)", fvs...); err != nil {
			return err
		}
		if err := compare(ctx, e.cfg, title+" (replay)", rvs...); err != nil {
			return err
		}
		sec := e.rep.section("1. Floor: "+title, floorNote(d, clients, e.cfg.replayKeys, raw))
		for _, v := range []*variant{fresh, plainFresh, luaFresh, defFresh} {
			if v != nil {
				sec.pair(raw, v)
			}
		}
		for _, v := range []*variant{replay, plainReplay, luaReplay} {
			if v != nil {
				sec.pair(get, v)
			}
		}
		if luaFresh != nil {
			e.rep.chartExtra = append(e.rep.chartExtra,
				chartRatio{short + " minimal-Lua fresh", ratio(luaFresh, raw), math.NaN()},
				chartRatio{short + " minimal-Lua read", ratio(luaReplay, get), math.NaN()})
		}
		e.rep.ratioTarget("floor, "+title+": fresh Do / raw 2-RT floor (median of interleaved rounds)", short+" fresh", fresh, raw, freshT)
		e.rep.ratioTarget("floor, "+title+": Do replay / raw GET (median of interleaved rounds)", short+" replay", replay, get, replayT)
		if d == 0 {
			// A batch is one round trip for the calls it carries: the round
			// trips of one call are counted without batching.
			e.rep.exactTarget("round trips per fresh Do (without batching; nobody waits: no extra round trip)", plainFresh.rtPerOp(), 2)
			e.rep.exactTarget("round trips per Do replay (without batching; nobody waits: no extra round trip)", plainReplay.rtPerOp(), 1)
			srvTarget(e.rep, "Redis CPU per fresh Do / the raw floor's (INFO cpu, "+title+")", fresh, raw, 1.15)
			srvTarget(e.rep, "Redis CPU per Do replay / a raw GET's (INFO cpu, "+title+")", replay, get, 1.10)
			srvTarget(e.rep, "Redis CPU per fresh Do without batching / the raw floor's (INFO cpu, "+title+")", plainFresh, raw, 1.15)
			srvTarget(e.rep, "Redis CPU per Do replay without batching / a raw GET's (INFO cpu, "+title+")", plainReplay, get, 1.10)
		}
	}
	return nil
}

// srvTarget records "v's server CPU per operation ≤ limit × base's" (the
// srv µs/op column; docs/benchmarks.md counts the same in instructions,
// which the machine's load does not move).
func srvTarget(r *report, name string, v, base *variant, limit float64) {
	x := math.NaN()
	if b := base.srvUsecPerOp(); b > 0 {
		x = v.srvUsecPerOp() / b
	}
	r.maxTarget(name, x, limit, fmtF(x, 2)+"×", fmt.Sprintf("≤ %.2f×", limit))
}

func floorNote(d time.Duration, clients, replayKeys int, raw *variant) string {
	s := fmt.Sprintf("%d concurrent client(s), one go-redis client per variant. The raw floor is the two round trips any "+
		"correct design needs: `SET <k>:l <owner> NX PX 30000` to claim, then `SET <k> <result> PX` to store the "+
		"~80 B result. Do stores the same result as JSON. Replays cycle over %d pre-completed keys. Every client sets "+
		"ContextTimeoutEnabled, as idem's README recommends (go-redis then returns by a context's deadline, and idem stores a "+
		"result on the caller's goroutine), except the row marked go-redis defaults. idem's store batches the scripts of "+
		"concurrent callers by default; the rows marked without batching send each as a command of its own.", clients, replayKeys)
	if d == 0 || clients == 1 {
		s += " The minimal-Lua rows do the same with the smallest scripts that could (claim: SET NX lease + SET record; " +
			"complete: SET + DEL; read: GET): the cost of any script-based design, without idem's record format and checks."
	}
	if d == 0 {
		s += " Bare loopback is CPU-bound on this machine: client and redis-server share the cores, and a Lua " +
			"script costs the server more CPU than a plain SET (column srv µs/op: redis-server user+system CPU per operation, INFO cpu)."
	} else {
		s += fmt.Sprintf(" Every round trip first waits %v in a go-redis hook (ProcessHook/ProcessPipelineHook; a timerfd "+
			"wait through Go's netpoller, shortened by its average overshoot, by at most a tenth), on both sides; measured mean delay per round trip: %v. "+
			"Redis still runs on this machine, so with many clients the run is partly CPU-bound again (client and server share "+
			"the cores); with one client it shows what the delay leaves of idem's cost for a single request.", d, raw.effectiveDelay().Round(time.Microsecond))
	}
	return s
}
