package main

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// hist is a log-linear latency histogram in nanoseconds: 64 sub-buckets per
// power of two (≤ 1.6 % error), fixed size, so add never allocates.
type hist struct {
	counts [64 * 35]uint64
	n      uint64
}

func bucketOf(ns int64) int {
	if ns < 64 {
		return int(max(ns, 0))
	}
	v := uint64(min(ns, 1<<40-1))
	e := bits.Len64(v) - 7 // v>>e in [64,128)
	return (e+1)*64 + int(v>>e) - 64
}

func bucketValue(i int) time.Duration {
	if i < 64 {
		return time.Duration(i)
	}
	e := i/64 - 1
	m := uint64(i%64 + 64)
	return time.Duration(m<<e + (uint64(1)<<e)/2)
}

func (h *hist) add(d time.Duration) { h.counts[bucketOf(int64(d))]++; h.n++ }

func (h *hist) merge(o *hist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
}

func (h *hist) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(h.n)))
	var cum uint64
	for i, c := range h.counts {
		cum += c
		if cum >= want && c > 0 {
			return bucketValue(i)
		}
	}
	return bucketValue(len(h.counts) - 1)
}

// rtHook counts go-redis round trips (one per processed command, one per
// pipeline) and optionally delays each, to simulate network latency.
//
// The delay is preciseSleep, shortened by a running average of its observed
// overshoot, by at most a tenth of the delay, so that the mean delay is
// what was asked for while the machine wakes sleepers on time, and no
// round trip is much quicker than the network it stands for; the time
// actually waited is recorded and reported.
type rtHook struct {
	n     *atomic.Int64
	delay time.Duration
	slept *atomic.Int64 // total ns waited
	over  *atomic.Int64 // running average overshoot, ns
}

func newRTHook(delay time.Duration) rtHook {
	return rtHook{n: new(atomic.Int64), delay: delay, slept: new(atomic.Int64), over: new(atomic.Int64)}
}

func (h rtHook) wait() {
	h.n.Add(1)
	if h.delay <= 0 {
		return
	}
	t := time.Now()
	over := h.over.Load()
	req := h.delay - min(time.Duration(over), h.delay/10)
	if req > 0 {
		preciseSleep(req)
	}
	got := time.Since(t)
	h.slept.Add(int64(got))
	// The average moves 1/16 of the way to this overshoot. (Moving it by
	// the shortfall of the whole wait instead would integrate: after a
	// long wait it cuts the next ones short, down to no wait at all, and
	// round trips come back quicker than the network they stand for.)
	for x := int64(got - req); !h.over.CompareAndSwap(over, over+(x-over)/16); {
		over = h.over.Load()
	}
}

func (h rtHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h rtHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.wait()
		return next(ctx, cmd)
	}
}

func (h rtHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.wait()
		return next(ctx, cmds)
	}
}

// variant is one side of a comparison: a workload run by clients goroutines.
type variant struct {
	name    string
	clients int
	// setup runs once before the first round (untimed); before runs before
	// every round (untimed). Both optional.
	setup  func(ctx context.Context) error
	before func(ctx context.Context) error
	// op performs one operation; w is the worker index, seq a per-worker
	// sequence number that never repeats within the run.
	op func(ctx context.Context, w int, seq uint64) error
	// rt counts round trips of the variant's client (nil: not counted).
	rt *atomic.Int64
	// hook gives the effective simulated delay (optional).
	hook *rtHook
	// keys the variant reads (replay baselines), for variants on the same data.
	keys []string
	// srv reads the server's cumulative command CPU time in µs (optional).
	srv func(ctx context.Context) (float64, error)

	// results
	rounds    []float64 // ops/s per round
	lat       hist
	ops       uint64
	errs      uint64
	firstErr  error
	rts       int64
	mallocs   uint64
	srvUsec   float64
	srvKnown  bool
	cliUsec   float64
	sleptNs   int64
	sleptN    int64
	seq       []uint64
	workerLat []hist
}

func (v *variant) opsPerSec() float64 {
	if len(v.rounds) == 0 {
		return 0
	}
	s := slices.Clone(v.rounds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (v *variant) rtPerOp() float64 {
	if v.rt == nil || v.ops == 0 {
		return math.NaN()
	}
	return float64(v.rts) / float64(v.ops)
}

func (v *variant) allocsPerOp() float64 {
	if v.ops == 0 {
		return math.NaN()
	}
	return float64(v.mallocs) / float64(v.ops)
}

func (v *variant) srvUsecPerOp() float64 {
	if !v.srvKnown || v.ops == 0 {
		return math.NaN()
	}
	return v.srvUsec / float64(v.ops)
}

// cliUsecPerOp is this process's CPU time (user + system) per operation.
func (v *variant) cliUsecPerOp() float64 {
	if v.ops == 0 {
		return math.NaN()
	}
	return v.cliUsec / float64(v.ops)
}

// processCPU returns the CPU time this process used so far, in µs.
func processCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e3
}

// effectiveDelay is the mean time the delay hook actually slept per round trip.
func (v *variant) effectiveDelay() time.Duration {
	if v.sleptN == 0 {
		return 0
	}
	return time.Duration(v.sleptNs / v.sleptN)
}

// maxOpsPerRound bounds every round in count as well as in time.
const maxOpsPerRound = 5_000_000

// runRound runs one timed round of v and accumulates its results.
func (v *variant) runRound(ctx context.Context, d time.Duration, record bool) error {
	if v.before != nil {
		if err := v.before(ctx); err != nil {
			return fmt.Errorf("%s: before round: %w", v.name, err)
		}
	}
	if v.seq == nil {
		v.seq = make([]uint64, v.clients)
		v.workerLat = make([]hist, v.clients)
	}
	for i := range v.workerLat {
		v.workerLat[i] = hist{}
	}
	var srv0 float64
	var srvOK bool
	if v.srv != nil {
		var err error
		srv0, err = v.srv(ctx)
		srvOK = err == nil
	}
	var rt0, slept0, sleptN0 int64
	if v.rt != nil {
		rt0 = v.rt.Load()
	}
	if v.hook != nil {
		slept0, sleptN0 = v.hook.slept.Load(), v.hook.n.Load()
	}
	var opsCount, errCount atomic.Uint64
	var errMu sync.Mutex
	var firstErr error
	perWorker := uint64(maxOpsPerRound / v.clients)

	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	cpu0 := processCPU()
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for w := range v.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := &v.workerLat[w]
			seq := v.seq[w]
			var n, ne uint64
			for n < perWorker && ctx.Err() == nil {
				t0 := time.Now()
				if t0.After(deadline) {
					break
				}
				err := v.op(ctx, w, seq)
				h.add(time.Since(t0))
				seq++
				n++
				if err != nil {
					ne++
					errMu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					errMu.Unlock()
				}
			}
			v.seq[w] = seq
			opsCount.Add(n)
			errCount.Add(ne)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu1 := processCPU()
	runtime.ReadMemStats(&ms1)
	if !record {
		return firstErr
	}
	ops := opsCount.Load()
	v.ops += ops
	v.errs += errCount.Load()
	if v.firstErr == nil {
		v.firstErr = firstErr
	}
	v.mallocs += ms1.Mallocs - ms0.Mallocs
	v.cliUsec += cpu1 - cpu0
	v.rounds = append(v.rounds, float64(ops)/elapsed.Seconds())
	for i := range v.workerLat {
		v.lat.merge(&v.workerLat[i])
	}
	if v.rt != nil {
		v.rts += v.rt.Load() - rt0
	}
	if v.hook != nil {
		v.sleptNs += v.hook.slept.Load() - slept0
		v.sleptN += v.hook.n.Load() - sleptN0
	}
	if srvOK {
		if s1, err := v.srv(ctx); err == nil {
			v.srvUsec += s1 - srv0
			v.srvKnown = true
		}
	}
	return nil
}

// compare runs the variants interleaved in cfg.rounds short rounds after
// one untimed warm-up round each, so that slow drift of the machine
// (thermal, other load, Redis memory growth) hits every variant alike. The
// order turns round by round (A B, then B A, …): no variant always runs
// first, or right after the same other one.
func compare(ctx context.Context, cfg *config, title string, vs ...*variant) error {
	for _, v := range vs {
		if v.setup != nil {
			if err := v.setup(ctx); err != nil {
				return fmt.Errorf("%s: setup: %w", v.name, err)
			}
		}
	}
	roundDur := cfg.duration / time.Duration(cfg.rounds)
	warm := max(roundDur/2, 20*time.Millisecond)
	for _, v := range vs {
		if err := v.runRound(ctx, warm, false); err != nil {
			return fmt.Errorf("%s: warm-up: %w", v.name, err)
		}
	}
	reversed := slices.Clone(vs)
	slices.Reverse(reversed)
	for r := range cfg.rounds {
		order := vs
		if r%2 == 1 {
			order = reversed
		}
		for _, v := range order {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := v.runRound(ctx, roundDur, true); err != nil {
				return err
			}
		}
		progress("  %s: round %d/%d", title, r+1, cfg.rounds)
	}
	for _, v := range vs {
		progress("  %-42s %9.0f ops/s  p50 %-8s p99 %-8s rt/op %-5s allocs/op %-4s cpu µs/op: client %-5s server %s%s",
			v.name, v.opsPerSec(), fmtDur(v.lat.quantile(0.5)), fmtDur(v.lat.quantile(0.99)),
			fmtF(v.rtPerOp(), 2), fmtF(v.allocsPerOp(), 0), fmtF(v.cliUsecPerOp(), 1), fmtF(v.srvUsecPerOp(), 1), errNote(v))
	}
	return nil
}

func errNote(v *variant) string {
	if v.errs == 0 {
		return ""
	}
	return fmt.Sprintf("  ERRORS %d (first: %v)", v.errs, v.firstErr)
}

var progressMu sync.Mutex

// progress writes one line of progress to stderr.
func progress(format string, args ...any) {
	progressMu.Lock()
	defer progressMu.Unlock()
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

func fmtDur(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
}

func fmtF(f float64, prec int) string {
	if math.IsNaN(f) {
		return "-"
	}
	return fmt.Sprintf("%.*f", prec, f)
}
