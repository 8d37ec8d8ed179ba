//go:build unix

package idem_test

// Random fault schedules: a seed chooses a topology, an entry point and a
// sequence of faults that the repository makes on loopback
// (internal/redistest) while the randomised workload of idemtest/verify
// calls idem from several goroutines through three Guards; the history
// checker then verifies the invariants over the whole history.
//
// The seed chooses (seed%3) the topology: a standalone redis-server with
// AOF (appendfsync everysec), a Sentinel deployment (a primary, two
// replicas, three Sentinels) or a three-master Cluster; and ((seed/3)%4) the
// entry point: Do, the HTTP middleware on a loopback server, Once, or each
// key through one of the three. On Sentinel, (seed/12)%2 == 0 runs with
// WithReplicaAck(1, 500ms), where no failover may lose a result (I3);
// otherwise without acks, where a failover is a documented limit whose
// violations the report attributes to it.
//
// The faults, by topology:
//   - all: replies lost after Redis executed a script (go-redis re-sends
//     it), a holder frozen past its lease while its side effect is under
//     way, and a lease that Redis ends early (its clock jumped forward),
//     simulated by deleting the lease key under the holder;
//   - standalone (through a proxy): network delay per direction, slow
//     replies, Redis frozen (SIGSTOP) for up to several leases, a restart
//     that keeps its data (SHUTDOWN SAVE), and Redis killed (SIGKILL) and
//     restarted from its AOF, which may lose the writes Redis acknowledged
//     in the seconds before the kill (everysec postpones them while a
//     background fsync is slow): a documented limit that reaches back
//     rfAOFReach, whose violations the report attributes to it, while a
//     loss of anything older or later is a violation;
//   - Sentinel: a failover with lagging replicas (the replicas frozen until
//     the primary holds a MiB for each that they lack, the primary killed,
//     a replica promoted; the first fault of every schedule), the primary
//     or a replica frozen for less than Sentinel's down-after;
//   - Cluster: a master frozen, a master restarted with its data.
//
// With IDEM_VERIFY_LIMITS=1, a standalone Redis runs without persistence
// and is also killed: a documented limit, whose violations the report
// attributes to it.
//
// In CI a few fixed seeds, covering every topology and entry point, run for
// a few seconds each. The long run:
//
//	IDEM_VERIFY_LONG=1 [IDEM_VERIFY_SEED=42] [IDEM_VERIFY_DURATION=10m] go test -run TestRandomFaults -v -timeout 0 .
//
// prints the seed, its topology and entry point, the faults applied, the
// history's size, the checker's time and the verdict. The schedule (which
// faults, when, for how long) is a function of the seed, so a failing seed
// replays the same schedule; the interleavings of the calls vary from run
// to run.

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	mrand "math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest/verify"
	"github.com/idemkit/idem/internal/redistest"
)

// rfLease is the lease of the schedules: short, so that faults longer than
// a lease happen often.
const (
	rfLease  = 400 * time.Millisecond
	rfWait   = 300 * time.Millisecond
	rfPrefix = "rf"
	rfMinLag = 1 << 20 // bytes each replica lacks when a Sentinel failover's primary dies
	// rfAOFReach is how far back a kill of Redis with AOF everysec may
	// lose acknowledged writes (see standaloneFault).
	rfAOFReach = 3 * time.Second
)

// rfCISeeds are CI's seeds: Sentinel with replica acks through Do (1),
// Cluster through the middleware (5), standalone through Once (6) and
// through all three (9).
var rfCISeeds = []uint64{1, 5, 6, 9}

func TestRandomFaults(t *testing.T) {
	t.Parallel()
	seeds, duration := rfCISeeds, 3*time.Second
	if os.Getenv("IDEM_VERIFY_LONG") == "1" {
		seeds, duration = longRunConfig(t)
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			runFaultSchedule(t, seed, duration)
		})
	}
}

// longRunConfig reads the seeds and the duration of the long run.
func longRunConfig(t *testing.T) ([]uint64, time.Duration) {
	t.Helper()
	duration := 5 * time.Minute
	if d := os.Getenv("IDEM_VERIFY_DURATION"); d != "" {
		var err error
		duration, err = time.ParseDuration(d)
		require.NoError(t, err, "IDEM_VERIFY_DURATION")
	}
	s := os.Getenv("IDEM_VERIFY_SEED")
	if s == "" {
		return []uint64{mrand.Uint64() % 1_000_000}, duration
	}
	var seeds []uint64
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		require.NoError(t, err, "IDEM_VERIFY_SEED")
		seeds = append(seeds, n)
	}
	return seeds, duration
}

// A topology is the Redis deployment a schedule runs against.
type topology int

const (
	standalone topology = iota
	sentinel
	cluster
)

func (tp topology) String() string {
	return [...]string{"standalone", "sentinel", "cluster"}[tp]
}

// faultRig is what a schedule acts on.
type faultRig struct {
	t       *testing.T
	topo    topology
	acks    bool // Sentinel: WithReplicaAck(1, 500ms)
	aof     bool // standalone: appendonly yes, appendfsync everysec
	srv     *redistest.Server
	proxy   *redistest.Proxy
	fo      *redistest.Failover
	cl      *redistest.Cluster
	dropper *redistest.ReplyDropper
	direct  redis.UniversalClient // to the deployment, without the proxy and the dropper
	h       *verify.History
	w       *verify.Workload
	limits  bool
	faults  int // faults applied so far

	jumps   atomic.Int32 // leases to end early, at the next runs
	freezes atomic.Int32 // holders to freeze, at the next runs
	applied map[string]int
}

// matchScripts matches every script call.
func matchScripts(args []string) bool {
	return len(args) > 0 && (strings.EqualFold(args[0], "EVALSHA") || strings.EqualFold(args[0], "EVAL"))
}

// newFaultRig starts the deployment that seed chooses.
func newFaultRig(t *testing.T, seed uint64) *faultRig {
	r := &faultRig{
		t: t, topo: topology(seed % 3), acks: (seed/12)%2 == 0,
		dropper: redistest.NewReplyDropper(matchScripts, 0),
		h:       verify.NewHistory(), limits: os.Getenv("IDEM_VERIFY_LIMITS") == "1", applied: map[string]int{},
	}
	switch r.topo {
	case standalone:
		var opts []redistest.Option
		if r.aof = !r.limits; r.aof {
			opts = append(opts, redistest.WithArgs("--appendonly", "yes", "--appendfsync", "everysec"))
		}
		r.srv = redistest.Start(t, opts...)
		r.proxy = redistest.StartProxy(t, r.srv.Addr())
		r.direct = r.srv.Client(t)
	case sentinel:
		r.fo = redistest.StartFailover(t)
		r.direct = r.fo.Client(t)
	case cluster:
		r.cl = redistest.StartCluster(t)
		r.direct = r.cl.Client(t)
	}
	return r
}

// describe names the deployment and what the schedule checks there.
func (r *faultRig) describe() string {
	switch {
	case r.topo == standalone && r.aof:
		return "standalone, AOF everysec"
	case r.topo == standalone:
		return "standalone, no persistence"
	case r.topo == sentinel && r.acks:
		return "sentinel, WithReplicaAck(1, 500ms)"
	case r.topo == sentinel:
		return "sentinel, no replica acks"
	}
	return r.topo.String()
}

func runFaultSchedule(t *testing.T, seed uint64, duration time.Duration) {
	r := newFaultRig(t, seed)
	w := &verify.Workload{
		Guards: r.guards(), Workers: 12, Keys: 1_000_000, KeyPrefix: "k", Payload: 128, Rate: 2000,
		Work: 20 * time.Millisecond, Timeout: 3 * time.Second, Seed: seed, OnRun: r.onRun,
		Via: verify.Via((seed / 3) % 4),
	}
	r.w = w
	sink := verify.NewSink(r.h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx, r.h, sink)
	}()
	rnd := mrand.New(mrand.NewPCG(seed, 0))
	t0 := time.Now()
	for end := t0.Add(duration); time.Now().Before(end); {
		r.fault(rnd)
		time.Sleep(time.Duration(50+rnd.IntN(250)) * time.Millisecond) // quiet between faults
	}
	cancel()
	<-done
	ran := time.Since(t0)
	if r.topo == sentinel {
		// The faults healed, but the Sentinels may still be failing over on
		// their own: a primary frozen on a loaded machine can outlast their
		// down-after. The probes start once the Sentinels have settled, or
		// a failover under way would switch the primary under them.
		r.fo.WaitSettled(t, 30*time.Second)
	}
	// What the workload's Guards still write in the background (a claim
	// whose answer never came, taken back; a completion) is part of the
	// healing: it ends before the probes.
	drain, stop := context.WithTimeout(context.Background(), rfLease+time.Minute)
	defer stop()
	for _, g := range w.Guards {
		require.NoError(t, g.Drain(drain), "a Guard's writes in the background did not end")
	}
	// The probes check that every key is free or completed; their store
	// timeout is far above what a loaded machine may take to answer.
	probe := idem.New(idem.NewRedisStore(r.direct, idem.WithPrefix(rfPrefix)), quietLogger(),
		idem.WithLease(rfLease), idem.WithWait(rfLease+rfWait+time.Second), idem.WithObserver(verify.Observer()),
		idem.WithStoreTimeout(10*time.Second))
	w.Probe(context.Background(), probe, r.h, sink)

	rep := verify.Check(r.h)
	calls, effects := r.h.Len()
	t.Logf("seed %d: %s, via %v: %v, %d faults %v; history %d calls, %d effects (%d fenced off), %d keys; checker %v; %d violation(s)",
		seed, r.describe(), w.Via, ran.Round(100*time.Millisecond), r.faults, r.applied, calls, effects, rep.Fenced, w.KeysUsed(), rep.CheckTime, rep.Total())
	t.Logf("seed %d: errors %v; p50 %v, p99 %v", seed, rep.Errors, rep.P50, rep.P99)
	require.Positive(t, rep.Effects, "the workload acted")
	for i, v := range rep.Violations {
		if i == 20 {
			break
		}
		t.Logf("seed %d: %s", seed, v)
	}
	requireWithinLimits(t, rep, seed, "")
}

// requireWithinLimits fails the schedule of seed on any violation the
// report does not blame on a documented limit: a failover without replica
// acks, a kill without persistence, or a kill with AOF everysec, which
// loses the writes of its last seconds (verify.Fault.Reach). Schedules
// with none of those faults must have no violation at all. run is the
// -run flag of the replay, "" for TestRandomFaults.
func requireWithinLimits(t *testing.T, rep *verify.Report, seed uint64, run string) {
	t.Helper()
	if rep.FromLimits > 0 {
		t.Logf("seed %d: %d violation(s), %d from documented limits", seed, rep.Total(), rep.FromLimits)
	}
	if run != "" {
		run = " go test -run " + run
	}
	require.Equal(t, rep.FromLimits, rep.Total(), "seed %d: %d violation(s) outside the documented limits; replay with IDEM_VERIFY_LONG=1 IDEM_VERIFY_SEED=%d%s",
		seed, rep.Total()-rep.FromLimits, seed, run)
}

// guards returns three Guards, through the dropper (and on standalone the
// proxy): one with go-redis's timeouts, one honouring context deadlines.
func (r *faultRig) guards() []*idem.Guard {
	var gs []*idem.Guard
	for i := range 3 {
		var c redis.UniversalClient
		switch r.topo {
		case standalone:
			c = redis.NewClient(&redis.Options{
				Addr: r.proxy.Addr(), Dialer: r.dropper.Dial, MaxRetries: 2,
				DialTimeout: 300 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second,
				ContextTimeoutEnabled: i == 1,
			})
		case sentinel:
			o := r.fo.FailoverOptions()
			o.Dialer, o.MaxRetries = r.dropper.Dial, 2
			o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 300*time.Millisecond, time.Second, time.Second
			o.ContextTimeoutEnabled = i == 1
			c = redis.NewFailoverClient(o)
		case cluster:
			o := r.cl.Options()
			o.Dialer, o.MaxRetries = r.dropper.Dial, 2
			o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 300*time.Millisecond, time.Second, time.Second
			o.ContextTimeoutEnabled = i == 1
			c = redis.NewClusterClient(o)
		}
		r.t.Cleanup(func() { _ = c.Close() })
		opts := []idem.RedisOption{idem.WithPrefix(rfPrefix)}
		if r.topo == sentinel && r.acks {
			opts = append(opts, idem.WithReplicaAck(1, 500*time.Millisecond))
		}
		gs = append(gs, idem.New(idem.NewRedisStore(c, opts...), quietLogger(), idem.WithObserver(verify.Observer()),
			idem.WithLease(rfLease), idem.WithWait(rfWait), idem.WithWriteTimeout(time.Second)))
	}
	return gs
}

func quietLogger() idem.Option { return idem.WithLogger(slog.New(slog.DiscardHandler)) }

// onRun injects the faults that act on a holder: its lease ended early by
// Redis (a clock jump), or the holder itself frozen past its lease.
func (r *faultRig) onRun(ctx context.Context, key string, a *idem.Attempt) {
	jump, freeze := take(&r.jumps), take(&r.freezes)
	if !jump && !freeze {
		return
	}
	// Redis ends the lease (its clock jumped, or the frozen holder could
	// not renew it), and a client retries the key at once.
	id := idem.OperationID(idem.KindOnce, "", key) // Once gives fn no Attempt
	if a != nil {
		id = a.ID
	}
	_, lease := idem.NewRedisStore(nil, idem.WithPrefix(rfPrefix)).Keys(id)
	dctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = r.direct.Del(dctx, lease).Err()
	cancel()
	r.w.Retry(key)
	if freeze {
		time.Sleep(2*rfLease + 100*time.Millisecond) // a GC pause or SIGSTOP: ctx is not looked at
	}
}

// take consumes one unit of n, reporting whether there was one.
func take(n *atomic.Int32) bool {
	for {
		v := n.Load()
		if v <= 0 {
			return false
		}
		if n.CompareAndSwap(v, v-1) {
			return true
		}
	}
}

// hold returns a random duration in [lo, hi).
func hold(rnd *mrand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rnd.Int64N(int64(hi-lo)))
}

// A fault is one fault of a schedule: apply it, hold it for d, heal it.
type fault struct {
	kind, name, limit string
	reach             time.Duration // see verify.Fault.Reach
	apply, heal       func()
	d                 time.Duration
}

// fault applies one fault chosen by rnd, holds it, and heals it, recording
// its interval in the history.
func (r *faultRig) fault(rnd *mrand.Rand) {
	f := r.common(rnd)
	if f == nil {
		switch r.topo {
		case standalone:
			f = r.standaloneFault(rnd)
		case sentinel:
			f = r.sentinelFault(rnd)
		case cluster:
			f = r.clusterFault(rnd)
		}
	}
	r.inject(rnd, f)
}

// inject applies f, holds it for its duration (chosen by rnd when it has
// none), and heals it, recording its interval in the history.
func (r *faultRig) inject(rnd *mrand.Rand, f *fault) {
	if f.d == 0 {
		f.d = hold(rnd, 100*time.Millisecond, 600*time.Millisecond)
	}
	r.faults++
	r.applied[f.kind]++
	start := r.h.Now()
	f.apply()
	time.Sleep(f.d) // the fault's duration, chosen by the schedule
	f.heal()
	r.h.AddFault(verify.Fault{Name: f.name, Limit: f.limit, Reach: f.reach, Start: start, End: r.h.Now()})
}

// common returns, one time in two, a fault every topology has, else nil.
// A Sentinel schedule starts with its failover instead.
func (r *faultRig) common(rnd *mrand.Rand) *fault {
	if (r.topo == sentinel && r.faults == 0) || rnd.IntN(2) == 0 {
		return nil
	}
	switch rnd.IntN(3) {
	case 0:
		n := 1 + rnd.IntN(3)
		return &fault{kind: "lost replies", name: fmt.Sprintf("lost replies: %d script replies dropped after execution", n),
			apply: func() { r.dropper.Arm(n) }, heal: func() { r.dropper.Arm(0) }}
	case 1:
		n := int32(1 + rnd.IntN(2))
		return &fault{kind: "clock jump", name: fmt.Sprintf("Redis clock jump: %d leases ended under their holders", n),
			apply: func() { r.jumps.Store(n) }, heal: func() { r.jumps.Store(0) }}
	default:
		n := int32(1 + rnd.IntN(2))
		return &fault{kind: "holder frozen", name: fmt.Sprintf("%d holders frozen past their lease", n),
			apply: func() { r.freezes.Store(n) }, heal: func() { r.freezes.Store(0) }}
	}
}

func (r *faultRig) standaloneFault(rnd *mrand.Rand) *fault {
	kinds := 4
	if r.aof || r.limits {
		kinds++
	}
	switch rnd.IntN(kinds) {
	case 0:
		up, down := hold(rnd, 0, 50*time.Millisecond), hold(rnd, 0, 50*time.Millisecond)
		return &fault{kind: "network delay", name: fmt.Sprintf("network delay up %v down %v", up.Round(time.Millisecond), down.Round(time.Millisecond)),
			apply: func() { r.proxy.SetDelay(up, down) }, heal: func() { r.proxy.SetDelay(0, 0) }}
	case 1:
		late, n := hold(rnd, rfLease/2, 2*rfLease), 1+rnd.IntN(4)
		return &fault{kind: "slow replies", name: fmt.Sprintf("slow replies: %d script replies %v late", n, late.Round(time.Millisecond)),
			apply: func() { r.proxy.DelayReplies(matchScripts, late, n) }, heal: r.proxy.ClearRules}
	case 2:
		d := hold(rnd, 50*time.Millisecond, 3*rfLease)
		return &fault{kind: "Redis frozen", name: fmt.Sprintf("Redis frozen (SIGSTOP) for %v", d.Round(time.Millisecond)),
			apply: func() { r.srv.Pause(r.t) }, heal: func() { r.srv.Resume(r.t) }, d: d}
	case 3:
		return &fault{kind: "Redis restart", name: "Redis restarted with its data (SHUTDOWN SAVE)",
			apply: func() { r.srv.Stop(r.t) }, heal: func() { r.srv.Restart(r.t) }}
	}
	if r.aof {
		// Redis writes its AOF buffer before it answers, unless a
		// background fsync is under way: then it answers first and
		// postpones the write, for up to two seconds. A kill loses what it
		// postponed, acknowledged writes included (on a loaded machine,
		// where fsyncs are slow), and nothing older: a documented limit
		// that reaches 2s back, 3s with a second for Redis's event loop
		// and clock (it counts the two seconds in whole-second ticks).
		return &fault{kind: "Redis killed, AOF", name: "Redis killed (SIGKILL) and restarted from its AOF (everysec)",
			limit: verify.LimitAOFEverysec, reach: rfAOFReach,
			apply: func() { r.srv.Kill(r.t) }, heal: func() { r.srv.Restart(r.t) }}
	}
	return &fault{kind: "Redis killed", name: "Redis killed and restarted without persistence", limit: verify.LimitRestart,
		apply: func() { r.srv.Kill(r.t) }, heal: func() { r.srv.Restart(r.t) }}
}

func (r *faultRig) sentinelFault(rnd *mrand.Rand) *fault {
	k := rnd.IntN(4)
	if r.faults == 0 {
		k = 0
	}
	switch k {
	case 0:
		f := &fault{kind: "failover", name: "Sentinel failover with lagging replicas", d: time.Millisecond}
		if !r.acks {
			f.limit = verify.LimitFailover
		}
		var old *redistest.Server
		f.apply = func() { old = r.failover() }
		f.heal = func() { old.Restart(r.t) } // Sentinel makes it a replica of the new primary
		return f
	case 1:
		d := hold(rnd, 50*time.Millisecond, time.Second) // below Sentinel's down-after
		var p *redistest.Server
		return &fault{kind: "primary frozen", name: fmt.Sprintf("primary frozen (SIGSTOP) for %v", d.Round(time.Millisecond)),
			apply: func() { p = r.fo.Primary(r.t); p.Pause(r.t) }, heal: func() { p.Resume(r.t) }, d: d}
	default:
		d := hold(rnd, 50*time.Millisecond, time.Second)
		var p *redistest.Server
		return &fault{kind: "replica frozen", name: fmt.Sprintf("a replica frozen (SIGSTOP) for %v", d.Round(time.Millisecond)),
			apply: func() { p = r.fo.Replicas(r.t)[rnd.IntN(2)]; p.Pause(r.t) }, heal: func() { p.Resume(r.t) }, d: d}
	}
}

// failover freezes both replicas until the primary holds rfMinLag bytes
// for each that they lack, kills the primary while the workload runs,
// resumes the replicas and waits until Sentinel promoted one. It returns
// the old primary, killed.
func (r *faultRig) failover() *redistest.Server {
	t := r.t
	r.replicasInSync() // after an earlier failover
	old := r.fo.Primary(t)
	replicas := r.fo.Replicas(t)
	require.Len(t, replicas, 2)
	for _, n := range replicas {
		n.Pause(t)
	}
	c := redis.NewClient(old.Options())
	defer c.Close()
	value := make([]byte, 64<<10)
	for i, deadline := 0, time.Now().Add(10*time.Second); ; i++ {
		require.NoError(t, c.Set(context.Background(), fmt.Sprintf("junk:%d", i), value, 10*time.Second).Err())
		if i%4 != 3 {
			continue
		}
		unsent := old.Unsent(t)
		if len(unsent) == 2 && slices.Min(slices.Collect(maps.Values(unsent))) >= rfMinLag+64<<10 {
			break
		}
		require.True(t, time.Now().Before(deadline), "replicas not %d bytes behind: %v", rfMinLag, unsent)
	}
	time.Sleep(300 * time.Millisecond) // traffic against the lone primary
	old.Kill(t)
	for _, n := range replicas {
		n.Resume(t)
	}
	r.fo.WaitFailover(t, old, 30*time.Second)
	return old
}

// replicasInSync waits until the primary has both replicas in sync, as
// they are again a while after a failover.
func (r *faultRig) replicasInSync() {
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		online := 0
		for _, rs := range r.fo.Primary(r.t).Replication(r.t).Replicas {
			if rs.State == "online" {
				online++
			}
		}
		if online == 2 {
			return
		}
		require.True(r.t, time.Now().Before(deadline), "the replicas did not resync after a failover")
	}
}

func (r *faultRig) clusterFault(rnd *mrand.Rand) *fault {
	n := r.cl.Nodes()[rnd.IntN(3)]
	if rnd.IntN(3) == 0 {
		return &fault{kind: "master restart", name: fmt.Sprintf("master %s restarted with its data (SHUTDOWN SAVE)", n.Addr()),
			apply: func() { n.Stop(r.t) }, heal: func() { n.Restart(r.t); r.clusterOK(n) }}
	}
	d := hold(rnd, 50*time.Millisecond, 3*rfLease) // below the cluster's node timeout
	return &fault{kind: "master frozen", name: fmt.Sprintf("master %s frozen (SIGSTOP) for %v", n.Addr(), d.Round(time.Millisecond)),
		apply: func() { n.Pause(r.t) }, heal: func() { n.Resume(r.t) }, d: d}
}

// clusterOK waits until n, restarted, reports cluster_state:ok: a master
// refuses commands (CLUSTERDOWN) for two seconds after it restarts, and
// the fault lasts until then.
func (r *faultRig) clusterOK(n *redistest.Server) {
	c := redis.NewClient(n.Options())
	defer c.Close()
	require.Eventually(r.t, func() bool {
		info, err := c.ClusterInfo(context.Background()).Result()
		return err == nil && strings.Contains(info, "cluster_state:ok")
	}, 20*time.Second, 20*time.Millisecond, "master %s not back in the cluster", n.Addr())
}
