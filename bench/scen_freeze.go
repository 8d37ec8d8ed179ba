package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// runFreeze is scenario 15: -clients clients send fresh keys through
// idem.Do, g.Middleware and idem proxy while Redis stops answering (frozen
// by SIGSTOP for 4 s and for 12 s, longer than go-redis's own waits; killed
// and restarted on its port after 4 s), and retry each refused key with the
// same key until it runs.

const (
	freezeRetryPause = 200 * time.Millisecond // a client's pause before it retries a key
	freezeTail       = time.Second            // fresh keys keep coming this long after Redis answers
	freezeDownFor    = 1500 * time.Millisecond
)

// freezeFault is how Redis stops answering, and for how long.
type freezeFault struct {
	name     string
	d        time.Duration
	down, up func(ctx context.Context, s *freezeServer) error
}

func freezeFaults(quick bool) []freezeFault {
	stop := func(_ context.Context, s *freezeServer) error { return s.signal(syscall.SIGSTOP) }
	cont := func(_ context.Context, s *freezeServer) error { return s.signal(syscall.SIGCONT) }
	kill := func(_ context.Context, s *freezeServer) error { s.stop(); return nil }
	if quick {
		return []freezeFault{{name: "frozen 1 s", d: time.Second, down: stop, up: cont}}
	}
	return []freezeFault{
		{name: "frozen 4 s", d: 4 * time.Second, down: stop, up: cont},
		{name: "frozen 12 s", d: 12 * time.Second, down: stop, up: cont},
		{name: "killed, restarted after 4 s", d: 4 * time.Second, down: kill, up: func(ctx context.Context, s *freezeServer) error { return s.launch(ctx) }},
	}
}

// freezeResult is what one entry point got through one fault.
type freezeResult struct {
	path, fault string
	during      hist          // latency of every request in flight during the fault (sent before it ended)
	slowest     time.Duration // its longest
	refusalP50  time.Duration // median refusal sent once Redis had been down freezeDownFor
	refusalsPS  float64       // refusals answered per second of the fault
	refusedKeys int
	recovery    []time.Duration // per refused key: from Redis answering to its first run
	notRun      int             // refused keys that never ran
	busyAfter   int             // 409s (ErrInProgress) answered after Redis answered
	notRecorded int             // Do: answers with ErrNotRecorded (fn ran, its result not stored in time)
	maxRuns     int             // the most runs of one key
	maxAttempt  int             // proxy: the highest Idempotency-Attempt a refused key reached the upstream with
	failed      int
}

// redisLog is go-redis's logger from the freeze scenario on: while quiet,
// it drops what go-redis says (a failed dial per request while Redis is
// down), since the scenario counts the refusals itself.
type redisLog struct {
	quiet atomic.Bool
	out   *log.Logger
}

func (l *redisLog) Printf(_ context.Context, format string, v ...any) {
	if !l.quiet.Load() {
		l.out.Printf(format, v...)
	}
}

func runFreeze(ctx context.Context, e *env) error {
	rl := &redisLog{out: log.New(os.Stderr, "redis: ", log.LstdFlags)}
	rl.quiet.Store(true)
	redis.SetLogger(rl)
	defer rl.quiet.Store(false)
	warm, recoverCap := time.Second, 45*time.Second // the recovery's cap: a lease (30 s) and more
	if e.cfg.quick {
		warm, recoverCap = 200*time.Millisecond, 10*time.Second
	}
	dir, err := os.MkdirTemp("", "idem-bench-freeze-bin-")
	if err != nil {
		return err
	}
	e.onClose(func() { os.RemoveAll(dir) })
	progress("scenario 15: building cmd/idem")
	bin, err := buildIdem(ctx, dir)
	if err != nil {
		return err
	}
	var rows []*freezeResult
	for _, f := range freezeFaults(e.cfg.quick) {
		for _, name := range []string{"do", "middleware", "proxy"} {
			s, err := startFreezeServer(ctx, e)
			if err != nil {
				return err
			}
			var p *freezePath
			switch name {
			case "do":
				p = doPath(e, s.addr())
			case "middleware":
				p = middlewarePath(e, s.addr())
			default:
				if p, err = proxyPath(e, bin, s.addr()); err != nil {
					return err
				}
			}
			progress("scenario 15: %s, %s, %d clients", p.name, f.name, e.cfg.clients)
			r, err := freezeLoad(ctx, e.cfg.clients, p, s, f, warm, recoverCap)
			s.stop()
			if err != nil {
				return fmt.Errorf("%s, %s: %w", p.name, f.name, err)
			}
			progress("  slowest answer %s, refusals/s %.0f, refused keys %d, 409s after %d, max runs per key %d",
				fmtDur(r.slowest), r.refusalsPS, r.refusedKeys, r.busyAfter, r.maxRuns)
			rows = append(rows, r)
		}
	}
	freezeReport(e, rows)
	return nil
}

// freezeLoad runs the clients through one fault and sums up what they got.
func freezeLoad(ctx context.Context, clients int, p *freezePath, s *freezeServer, f freezeFault, warm, recoverCap time.Duration) (*freezeResult, error) {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu        sync.Mutex
		calls     []freezeCall
		noFresh   atomic.Bool
		wg        sync.WaitGroup
		pauseDone = func() bool {
			select {
			case <-lctx.Done():
				return false
			case <-time.After(freezeRetryPause):
				return true
			}
		}
	)
	for w := range clients {
		wg.Go(func() {
			var mine []freezeCall
			defer func() { mu.Lock(); calls = append(calls, mine...); mu.Unlock() }()
			for seq := 0; !noFresh.Load() && lctx.Err() == nil; seq++ {
				key := fmt.Sprintf("fz-%d-%d", w, seq)
				for {
					start := time.Now()
					k := p.send(lctx, key)
					mine = append(mine, freezeCall{key: key, start: start, end: time.Now(), kind: k})
					if k == answered || k == notRecorded || !pauseDone() {
						break
					}
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	time.Sleep(warm) // the load before the fault
	down := time.Now()
	if err := f.down(ctx, s); err != nil {
		return nil, err
	}
	time.Sleep(f.d) // the fault itself
	up := time.Now()
	if err := f.up(ctx, s); err != nil {
		return nil, err
	}
	back, err := s.answering(ctx)
	if err != nil {
		return nil, err
	}
	time.Sleep(time.Until(back.Add(freezeTail)))
	noFresh.Store(true) // each client finishes its key, retrying it until it runs
	select {
	case <-done:
	case <-time.After(time.Until(back.Add(recoverCap))):
		cancel()
		<-done
	}
	return freezeSum(p, f, calls, down, up, back), nil
}

// freezeSum computes the figures of one run from its requests and the runs
// its entry point logged: the fault lasted from down to up, and Redis
// answered again at back.
func freezeSum(p *freezePath, f freezeFault, calls []freezeCall, down, up, back time.Time) *freezeResult {
	r := &freezeResult{path: p.name, fault: f.name}
	refusedKeys := map[string]bool{}
	var late []time.Duration
	refusals := 0
	for _, c := range calls {
		if c.start.Before(up) && c.end.After(down) {
			d := c.end.Sub(c.start)
			r.during.add(d)
			r.slowest = max(r.slowest, d)
		}
		switch c.kind {
		case refused:
			if c.start.Before(back) {
				refusedKeys[c.key] = true
			}
			if !c.end.Before(down) && c.end.Before(up) {
				refusals++
			}
			if !c.start.Before(down.Add(freezeDownFor)) && c.start.Before(up) {
				late = append(late, c.end.Sub(c.start))
			}
		case notRecorded:
			r.notRecorded++
		case busy:
			if !c.end.Before(back) {
				r.busyAfter++
			}
		case failed:
			r.failed++
		}
	}
	r.refusalsPS = float64(refusals) / up.Sub(down).Seconds()
	if len(late) > 0 {
		slices.Sort(late)
		r.refusalP50 = late[len(late)/2]
	}
	r.refusedKeys = len(refusedKeys)
	p.log.mu.Lock()
	defer p.log.mu.Unlock()
	for k := range refusedKeys {
		first, ok := p.log.first[k]
		if !ok {
			r.notRun++
			continue
		}
		r.recovery = append(r.recovery, max(first.Sub(back), 0))
		r.maxAttempt = max(r.maxAttempt, p.log.upAtt[k])
	}
	slices.Sort(r.recovery)
	for _, n := range p.log.runs {
		r.maxRuns = max(r.maxRuns, n)
	}
	return r
}

// freezeReport writes section 15 and its targets.
func freezeReport(e *env, rows []*freezeResult) {
	var b strings.Builder
	b.WriteString("| entry point | fault | answers during the fault: p50 / p99 / slowest | median refusal once down 1.5 s | refusals/s | keys refused | Redis answering → refused key ran: median / slowest | not run | 409s after recovery | `ErrNotRecorded` | runs per key (max) | `Idempotency-Attempt` of a refused key (max) | other errors |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	busy, runs := 0, 0
	var slowestRecovery time.Duration
	for _, r := range rows {
		rec := "-"
		if n := len(r.recovery); n > 0 {
			rec = fmtDur(r.recovery[n/2]) + " / " + fmtDur(r.recovery[n-1])
			slowestRecovery = max(slowestRecovery, r.recovery[n-1])
		}
		att := "-"
		if r.maxAttempt > 0 {
			att = fmt.Sprint(r.maxAttempt)
		}
		nr := "-" // invisible through HTTP: the client gets the handler's response
		if r.path == "`idem.Do`" {
			nr = fmt.Sprint(r.notRecorded)
		}
		fmt.Fprintf(&b, "| %s | %s | %s / %s / %s | %s | %.1f | %d | %s | %d | %d | %s | %d | %s | %d |\n", r.path, r.fault,
			fmtDur(min(r.during.quantile(0.5), r.slowest)), fmtDur(min(r.during.quantile(0.99), r.slowest)), fmtDur(r.slowest), fmtDur(r.refusalP50),
			r.refusalsPS, r.refusedKeys, rec, r.notRun, r.busyAfter, nr, r.maxRuns, att, r.failed)
		busy += r.busyAfter
		runs = max(runs, r.maxRuns)
		if r.fault == freezeFaults(e.cfg.quick)[0].name {
			e.rep.maxTarget("Redis "+r.fault+", "+r.path+": slowest answer during the fault", r.slowest.Seconds(), 1.5,
				fmtDur(r.slowest), "≤ 1.50s")
		}
	}
	e.rep.exactTarget("Redis frozen or killed: 409s after recovery", float64(busy), 0)
	e.rep.exactTarget("Redis frozen or killed: runs per key (max)", float64(runs), 1)
	e.rep.maxTarget("Redis frozen or killed: Redis answering → refused key ran (slowest)", slowestRecovery.Seconds(), 1.5,
		fmtDur(slowestRecovery), "≤ 1.50s")
	sec := e.rep.section("15. When Redis freezes",
		fmt.Sprintf("%d clients send fresh keys through `idem.Do`, `g.Middleware` (an `httptest.Server`) and `idem proxy` (a process "+
			"of its own, default flags), each in front of its own redis-server, which is frozen (`SIGSTOP`, then `SIGCONT`) or killed "+
			"(`SIGKILL`) and restarted on its port. The go-redis clients set `ContextTimeoutEnabled`; the Guards have idem's defaults "+
			"(no `WithWait`, lease 30 s). A client retries a refused key (503, `ErrStoreUnavailable`) or a busy one (409, "+
			"`ErrInProgress`) with the same key every %v until it runs, and sends fresh keys until %v after Redis answers again. "+
			"Answers during the fault: every request in flight while Redis did not answer (sent before `SIGCONT` or the restart). Keys refused: keys "+
			"refused before Redis answered; their wait is from Redis answering (a PING from another client) to their function's "+
			"first run, which must come within the recovery's cap (not run: it did not). `ErrNotRecorded`: answers of `Do` whose function "+
			"ran and whose result was not stored in time (through HTTP the client gets the handler's own response).", e.cfg.clients, freezeRetryPause, freezeTail))
	sec.body = b.String()
}
