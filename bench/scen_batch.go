package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/redis/go-redis/v9"
)

// batchScale is the share of -duration each batching comparison measures
// per variant: it runs 42 comparisons of two variants (36, and each pass's
// two A/A pairs).
const batchScale = 0.4

// batchLevels are the client counts of the batching scenario: below, at and
// above the store's direct-call threshold (four calls in flight).
var batchLevels = []int{1, 2, 4, 8, 16, 64}

// batchLevel is one client count of the batching scenario: fresh Do and
// replays, each on a plain store (WithoutAutoPipeline) and on a batching
// one (the default).
type batchLevel struct {
	clients                        int
	aa                             bool // both sides plain: the run's noise
	fresh, freshB, replay, replayB *variant
}

// runBatching is scenario 13: idem.Do on a plain store and on a batching
// one at each of batchLevels, fresh keys and replays, interleaved per
// level: over bare loopback (13), with -delay per round trip (13b), and
// with four times -delay (13c), where the round trips rather than the
// shared cores bound the plain store at eight clients.
func runBatching(ctx context.Context, e *env) error {
	cfg := scaled(e.cfg, batchScale)
	levels := batchLevels
	if e.cfg.quick {
		levels = []int{1, 8}
	}
	for i, d := range []time.Duration{0, e.cfg.delay, 4 * e.cfg.delay} {
		where := "bare loopback"
		if d > 0 {
			where = fmt.Sprintf("%v simulated delay per round trip", d)
		}
		progress("scenario 13: batching by client count, %s, clients %v", where, levels)
		// First the control: one client, plain on both sides.
		aa, err := batchCompare(ctx, e, cfg, d, 1, where, true)
		if err != nil {
			return err
		}
		rows := []batchLevel{aa}
		for _, n := range levels {
			row, err := batchCompare(ctx, e, cfg, d, n, where, false)
			if err != nil {
				return err
			}
			rows = append(rows, row)
		}
		title := fmt.Sprintf("13%s. Batching by client count: batched (the default) vs WithoutAutoPipeline, %s", []string{"", "b", "c"}[i], where)
		note := batchNote(cfg, d, rows[1].fresh.effectiveDelay())
		sec := e.rep.section(title, note)
		sec.body = batchTable(rows)
	}
	return nil
}

// batchCompare measures one level: fresh Do plain and batched interleaved,
// then replays plain and batched interleaved. With aa, the second side is
// plain too: the pair measures the same code twice, the run's noise.
func batchCompare(ctx context.Context, e *env, cfg *config, d time.Duration, n int, where string, aa bool) (batchLevel, error) {
	tag := fmt.Sprintf("bt-%s-d%d-c%d", e.nonce, d.Microseconds(), n)
	second, batched := pipeGuard, "batched"
	if aa {
		tag += "-aa"
		second, batched = plainGuard, "WithoutAutoPipeline again"
	}
	mk := func() (redis.UniversalClient, *rtHook) { return e.client(d, n) }
	row := batchLevel{clients: n, aa: aa}
	c1, h1 := mk()
	c2, h2 := mk()
	row.fresh = batchFresh(fmt.Sprintf("idem.Do fresh, WithoutAutoPipeline, %d clients", n), n, plainGuard(c1, tag+"-f"), h1, e.serverUsec)
	row.freshB = batchFresh(fmt.Sprintf("idem.Do fresh, %s, %d clients", batched, n), n, second(c2, tag+"-fb"), h2, e.serverUsec)
	if err := compare(ctx, cfg, fmt.Sprintf("batching, %s, fresh, %d clients", where, n), row.fresh, row.freshB); err != nil {
		return row, err
	}
	c3, h3 := mk()
	c4, h4 := mk()
	row.replay = batchReplay(e, fmt.Sprintf("idem.Do replays, WithoutAutoPipeline, %d clients", n), n, plainGuard(c3, tag+"-r"), h3)
	row.replayB = batchReplay(e, fmt.Sprintf("idem.Do replays, %s, %d clients", batched, n), n, second(c4, tag+"-rb"), h4)
	err := compare(ctx, cfg, fmt.Sprintf("batching, %s, replays, %d clients", where, n), row.replay, row.replayB)
	return row, err
}

// plainGuard returns a Guard on c with its own prefix whose store sends
// every call directly (idem.WithoutAutoPipeline).
func plainGuard(c redis.UniversalClient, prefix string) *idem.Guard {
	s := idem.NewRedisStore(c, idem.WithPrefix(prefix), idem.WithoutAutoPipeline())
	return idem.New(s, idem.WithRetention(retention))
}

// batchFresh is idem.Do on fresh keys through g, whose client h counts and
// delays.
func batchFresh(name string, n int, g *idem.Guard, h *rtHook, srv func(context.Context) (float64, error)) *variant {
	return &variant{name: name, clients: n, rt: h.n, hook: h, srv: srv, op: doOp(g, keyer("k"))}
}

// batchReplay is idem.Do replays through g over -replay-keys keys it
// completes first; a replay that runs the function again is an error.
func batchReplay(e *env, name string, n int, g *idem.Guard, h *rtHook) *variant {
	nk := e.cfg.replayKeys
	keys := make([]string, nk)
	for i := range keys {
		keys[i] = "replay-" + strconv.Itoa(i)
	}
	var reran atomic.Int64
	fn := func(context.Context, *idem.Attempt) (payment, error) { reran.Add(1); return thePayment, nil }
	return &variant{
		name: name, clients: n, rt: h.n, hook: h, srv: e.serverUsec,
		setup: func(ctx context.Context) error {
			err := populate(ctx, nk, func(ctx context.Context, i int) error { _, err := idem.Do(ctx, g, keys[i], theReq, fn); return err })
			reran.Store(0)
			return err
		},
		op: func(ctx context.Context, w int, seq uint64) error {
			p, err := idem.Do(ctx, g, keys[(uint64(w)*7919+seq)%uint64(nk)], theReq, fn)
			if err == nil && p.ID != thePayment.ID {
				err = fmt.Errorf("replay returned %+v", p)
			}
			if err == nil && reran.Load() > 0 {
				err = errors.New("a replay ran the function again")
			}
			return err
		},
	}
}

func batchNote(cfg *config, d, measured time.Duration) string {
	s := fmt.Sprintf("`idem.Do` on a store with `idem.WithoutAutoPipeline()` (plain) and on one that batches (the default), at each client count: the fresh pair "+
		"interleaved round by round, then the replay pair (replays cycle over pre-completed keys). Each variant has its own go-redis "+
		"client (ContextTimeoutEnabled, pool ≥ clients). %v per variant in %d rounds. **batched ÷ plain** is the ratio of the medians "+
		"over rounds; *rounds ahead* counts the rounds in which the batched variant served more than the plain one that ran beside it, "+
		"and *per-round* gives the lowest and highest of those paired ratios, the spread that other work on the machine (2 shared "+
		"cores) put on the figure. RT/op counts a batch once; CPU is client + redis-server µs per operation. The default store batches only while "+
		"its callers queue (its calls' median over 1.5× the quickest ones, `idem.WithAutoPipeline`), and then only with more than "+
		"four calls in flight: where they wait on round trips alone, and at 1 to 4 clients, the pair measures the same code "+
		"twice, and its spread is the run's noise. The first row is the control: one client, both sides plain (A/A), so its "+
		"ratio is that noise alone.", cfg.duration, cfg.rounds)
	if d > 0 {
		s += fmt.Sprintf(" Every round trip (a command, or a batch) first waits %v in a go-redis hook, as in section 1; measured mean "+
			"delay per round trip: %v. Redis still runs on this machine, so where the plain store's clients together keep the cores "+
			"busy the run is CPU-bound again, as on loopback.", d, measured.Round(time.Microsecond))
	}
	return s
}

// batchTable renders the fresh and replay tables of one section.
func batchTable(rows []batchLevel) string {
	var b strings.Builder
	for _, kind := range []string{"Fresh `Do`", "Replays"} {
		fmt.Fprintf(&b, "%s:\n\n", kind)
		b.WriteString("| clients | plain ops/s | batched ops/s | batched ÷ plain | rounds ahead | per-round | p50 plain → batched | p99 plain → batched | RT/op plain / batched | CPU µs/op plain / batched | errors |\n")
		b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range rows {
			a, v := r.fresh, r.freshB
			if kind == "Replays" {
				a, v = r.replay, r.replayB
			}
			ahead, lo, hi := pairedRounds(a, v)
			clients := strconv.Itoa(r.clients)
			if r.aa {
				clients += ", A/A: plain twice"
			}
			fmt.Fprintf(&b, "| %s | %.0f | %.0f | **%.2f×** | %d of %d | %.2f–%.2f× | %s → %s | %s → %s | %s / %s | %s / %s | %d |\n",
				clients, a.opsPerSec(), v.opsPerSec(), ratio(v, a), ahead, min(len(a.rounds), len(v.rounds)), lo, hi,
				fmtDur(a.lat.quantile(0.5)), fmtDur(v.lat.quantile(0.5)), fmtDur(a.lat.quantile(0.99)), fmtDur(v.lat.quantile(0.99)),
				fmtF(a.rtPerOp(), 2), fmtF(v.rtPerOp(), 2), fmtF(a.cliUsecPerOp()+a.srvUsecPerOp(), 1), fmtF(v.cliUsecPerOp()+v.srvUsecPerOp(), 1),
				a.errs+v.errs)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// pairedRounds compares v with base round by round (round i of each ran
// side by side): how many of v's rounds were faster, and the lowest and
// highest ratio v ÷ base.
func pairedRounds(base, v *variant) (ahead int, lo, hi float64) {
	seen := false
	for i := range min(len(base.rounds), len(v.rounds)) {
		if base.rounds[i] == 0 {
			continue
		}
		x := v.rounds[i] / base.rounds[i]
		if x > 1 {
			ahead++
		}
		if !seen || x < lo {
			lo = x
		}
		if !seen || x > hi {
			hi = x
		}
		seen = true
	}
	return ahead, lo, hi
}
