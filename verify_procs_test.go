//go:build unix

package idem_test

// Random fault schedules over processes: the randomised workload runs in
// rfProcs child processes (this test binary re-executed with rfChildEnv
// set, so that it runs TestVerifyProcessChild only), each with 16
// goroutines and three Guards, against one standalone redis-server (AOF
// everysec) through the parent's proxy. The children record their calls
// in, and offer their effects to, the parent's History and fenced Sink
// through a loopback HTTP server (verify.Handler, verify.Remote), so that
// the sink's fence check spans the processes and the checker sees one
// history. Besides the standalone faults of TestRandomFaults, the schedule
// freezes a child (SIGSTOP) past the lease and resumes it (SIGCONT), and
// kills a child (SIGKILL) and starts a replacement; a killed child's calls
// in flight stay unfinished in the history.
//
// The seed chooses the entry point (seed%2): Do or the HTTP middleware,
// whose functions get Attempt.Fence. Once gives none, and a process frozen
// between its reconciliation and its effect acts again when it resumes: a
// documented limit (docs/guarantees.md, "A holder that freezes") that only
// a fence checked by the receiver removes.

import (
	"context"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http/httptest"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest/verify"
	"github.com/idemkit/idem/internal/childtest"
	"github.com/idemkit/idem/internal/redistest"
)

const (
	rfProcs    = 3   // child processes at any time
	rfProcRate = 200 // calls per second at most, per child

	rfChildEnv   = "IDEM_RF_CHILD"   // the child's seed
	rfHistoryEnv = "IDEM_RF_HISTORY" // the URL of the parent's verify.Handler
	rfRedisEnv   = "IDEM_RF_REDIS"   // the address of Redis (the parent's proxy)
	rfViaEnv     = "IDEM_RF_VIA"     // the entry point
)

// rfProcCISeeds is CI's seed: through Do, a child frozen, then one killed, then again.
var rfProcCISeeds = []uint64{24}

func TestRandomFaultsProcesses(t *testing.T) {
	t.Parallel()
	seeds, duration := rfProcCISeeds, 3*time.Second
	if os.Getenv("IDEM_VERIFY_LONG") == "1" {
		seeds, duration = longRunConfig(t)
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			runProcessSchedule(t, seed, duration)
		})
	}
}

// TestVerifyProcessChild is the body of the child processes of
// TestRandomFaultsProcesses; run directly, it skips. It runs the workload
// until its standard input closes.
func TestVerifyProcessChild(t *testing.T) {
	s := os.Getenv(rfChildEnv)
	if s == "" {
		t.Skip("helper process for TestRandomFaultsProcesses")
	}
	if err := runProcessChild(s); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	os.Exit(0)
}

func runProcessChild(s string) error {
	seed, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return err
	}
	via, err := strconv.Atoi(os.Getenv(rfViaEnv))
	if err != nil {
		return err
	}
	var gs []*idem.Guard
	for i := range 3 {
		c := redis.NewClient(&redis.Options{
			Addr: os.Getenv(rfRedisEnv), MaxRetries: 2,
			DialTimeout: 300 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second,
			ContextTimeoutEnabled: i == 1,
		})
		defer c.Close()
		gs = append(gs, idem.New(idem.NewRedisStore(c, idem.WithPrefix(rfPrefix)), quietLogger(), idem.WithObserver(verify.Observer()),
			idem.WithLease(rfLease), idem.WithWait(rfWait), idem.WithWriteTimeout(time.Second)))
	}
	h, sink := verify.Remote(os.Getenv(rfHistoryEnv))
	w := rfProcWorkload(seed, verify.Via(via))
	w.Guards, w.Workers, w.Rate, w.Work, w.Timeout = gs, 16, rfProcRate, 20*time.Millisecond, 3*time.Second
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin) // the parent closes it to stop the child
		cancel()
	}()
	w.Run(ctx, h, sink)
	return h.Err()
}

// rfProcWorkload returns the workload's shape shared by the children and
// the parent's probes: the keys, their results and their entry point.
func rfProcWorkload(seed uint64, via verify.Via) *verify.Workload {
	return &verify.Workload{Keys: 1_000_000, KeyPrefix: "k", Payload: 128, Seed: seed, Via: via}
}

// rfChild is a running child process.
type rfChild struct {
	*childtest.Child[childtest.None]
	killed bool
}

// procRig is a process schedule's state on top of a standalone faultRig.
type procRig struct {
	*faultRig
	url      string
	via      verify.Via
	seed     uint64
	started  int // children started so far: the next child's number
	children []*rfChild
	all      []*rfChild
}

// start starts a child in slot i.
func (p *procRig) start(i int) {
	t := p.t
	c := &rfChild{Child: childtest.Start[childtest.None](t, "TestVerifyProcessChild", 0,
		rfChildEnv+"="+strconv.FormatUint(p.seed*1000+uint64(p.started), 10),
		rfHistoryEnv+"="+p.url,
		rfRedisEnv+"="+p.proxy.Addr(),
		rfViaEnv+"="+strconv.Itoa(int(p.via)),
	)}
	p.started++
	p.children[i] = c
	p.all = append(p.all, c)
}

// procFault returns a fault on a child chosen by rnd: frozen past the
// lease, or killed and replaced.
func (p *procRig) procFault(rnd *mrand.Rand) *fault {
	i := rnd.IntN(rfProcs)
	if rnd.IntN(2) == 0 {
		d := hold(rnd, 2*rfLease, 4*rfLease)
		var c *rfChild
		return &fault{kind: "process frozen", name: fmt.Sprintf("holder process %d frozen (SIGSTOP) for %v", i, d.Round(time.Millisecond)), d: d,
			apply: func() { c = p.children[i]; c.Signal(p.t, syscall.SIGSTOP) },
			heal:  func() { c.Signal(p.t, syscall.SIGCONT) }}
	}
	return &fault{kind: "process killed", name: fmt.Sprintf("holder process %d killed (SIGKILL) and replaced", i),
		apply: func() {
			c := p.children[i]
			c.killed = true
			c.Signal(p.t, syscall.SIGKILL)
			_ = c.Wait(p.t)
		},
		heal: func() { p.start(i) }}
}

func runProcessSchedule(t *testing.T, seed uint64, duration time.Duration) {
	srv := redistest.Start(t, redistest.WithArgs("--appendonly", "yes", "--appendfsync", "everysec"))
	r := &faultRig{t: t, topo: standalone, aof: true, srv: srv, proxy: redistest.StartProxy(t, srv.Addr()),
		direct: srv.Client(t), h: verify.NewHistory(), applied: map[string]int{}}
	sink := verify.NewSink(r.h)
	hs := httptest.NewServer(verify.Handler(r.h, sink))
	t.Cleanup(hs.Close)
	p := &procRig{faultRig: r, url: hs.URL, via: verify.Via(seed % 2), seed: seed, children: make([]*rfChild, rfProcs)}
	for i := range rfProcs {
		p.start(i)
	}
	rnd := mrand.New(mrand.NewPCG(seed, 0))
	t0 := time.Now()
	for end := t0.Add(duration); time.Now().Before(end); {
		if rnd.IntN(3) < 2 {
			r.inject(rnd, p.procFault(rnd))
		} else {
			r.inject(rnd, r.standaloneFault(rnd))
		}
		time.Sleep(time.Duration(50+rnd.IntN(250)) * time.Millisecond) // quiet between faults
	}
	for _, c := range p.children {
		_ = c.Stdin.Close()
	}
	for _, c := range p.all {
		err := c.Wait(t)
		if !c.killed {
			require.NoError(t, err, "seed %d: child failed\n%s", seed, c.Stderr())
		}
	}
	ran := time.Since(t0)

	w := rfProcWorkload(seed, p.via)
	probe := idem.New(idem.NewRedisStore(r.direct, idem.WithPrefix(rfPrefix)), quietLogger(),
		idem.WithLease(rfLease), idem.WithWait(rfLease+rfWait+time.Second), idem.WithObserver(verify.Observer()))
	keys := r.h.Keys()
	w.ProbeKeys(context.Background(), probe, r.h, sink, keys)

	rep := verify.Check(r.h)
	calls, effects := r.h.Len()
	t.Logf("seed %d: %d processes × 16 goroutines (%d started), %s, via %v: %v, %d faults %v; history %d calls (%d unfinished), %d effects (%d fenced off), %d keys; checker %v; %d violation(s)",
		seed, rfProcs, p.started, r.describe(), p.via, ran.Round(100*time.Millisecond), r.faults, r.applied, calls, rep.Unfinished, effects, rep.Fenced, len(keys), rep.CheckTime, rep.Total())
	t.Logf("seed %d: errors %v; p50 %v, p99 %v", seed, rep.Errors, rep.P50, rep.P99)
	require.Positive(t, rep.Effects, "the workload acted")
	for i, v := range rep.Violations {
		if i == 20 {
			break
		}
		t.Logf("seed %d: %s", seed, v)
	}
	requireWithinLimits(t, rep, seed, "TestRandomFaultsProcesses")
}
