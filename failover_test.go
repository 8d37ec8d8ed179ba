//go:build unix

package idem_test

// A Sentinel failover under load, on real processes (internal/redistest):
// a primary, two replicas and three redis-sentinel, three Guards with their
// own go-redis failover clients. On loopback replicas are never behind, so a
// plain kill -9 of the primary loses nothing and catches nothing: the
// replicas are first frozen (SIGSTOP) until the primary holds at least 1 MiB
// for each in its own output buffers (what sits in socket buffers, megabytes
// on loopback, still arrives after the kill), the primary is killed while
// traffic runs, the replicas resumed, and Sentinel promotes one of them,
// which lacks the writes of the freeze.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redistest"
)

const (
	foWorkers   = 16      // per Guard (3 of them); worker i of every Guard works on team i's keys
	foMinLag    = 1 << 20 // bytes each replica must be behind when the primary dies
	foLease     = 2 * time.Second
	foKeyBudget = 15 * time.Second // how long a caller retries one key before giving up
	foPhase     = 10 * time.Second // bound of every wait for progress
	foEffect    = 150 * time.Millisecond
)

// TestFailoverLostWrites runs the scenario twice. Without replica acks it
// logs the damage, which is expected: the new primary lacks every claim and
// result written while the replicas were frozen. With WithReplicaAck(1, 500ms)
// nothing a caller was given may be lost and no effect may run twice.
func TestFailoverLostWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("a Sentinel failover under load takes about ten seconds")
	}
	// The runs have servers of their own and spend most of their time
	// waiting for Sentinel: they run side by side, and beside other tests.
	t.Parallel()
	t.Run("no acks", func(t *testing.T) {
		t.Parallel()
		fig := runFailover(t)
		t.Logf("without replica acks: %v", fig)
	})
	t.Run("replica ack", func(t *testing.T) {
		t.Parallel()
		fig := runFailover(t, idem.WithReplicaAck(1, 500*time.Millisecond))
		t.Logf("with WithReplicaAck(1, 500ms): %v", fig)
		require.Zero(t, fig.duplicates, "duplicated effects with replica acks: %v", fig)
		require.Zero(t, fig.lost, "lost results with replica acks: %v", fig)
	})
	t.Run("replica ack, auto-pipelined", func(t *testing.T) {
		t.Parallel()
		fig := runFailover(t, idem.WithReplicaAck(1, 500*time.Millisecond), idem.WithAutoPipeline())
		t.Logf("with WithReplicaAck(1, 500ms) and WithAutoPipeline: %v", fig)
		require.Zero(t, fig.duplicates, "duplicated effects with replica acks: %v", fig)
		require.Zero(t, fig.lost, "lost results with replica acks: %v", fig)
	})
}

// foFigures is what one run measured.
type foFigures struct {
	ops        int64            // Do calls by the traffic, retries included
	keys       int              // keys for which some caller got a result
	results    int64            // results handed to callers (first answers and replays)
	execs      int              // executions of fn, the read-back included
	duplicates int              // see foLog.count
	sameFence  int              // duplicates that reran a (key, fence) pair
	afterValue int              // duplicates that ran after a caller had a result
	lost       int              // see foLog.count
	onlyReplay int              // lost results that no caller got as a first answer, only as replays
	unreadable int              // keys whose read-back kept failing (counted in lost)
	lag        map[string]int64 // bytes each replica was behind when the primary died
	missed     int64            // bytes the promoted replica never got (at least)
	failover   time.Duration    // kill -9 to a writable new primary
	took       time.Duration    // the whole run
}

func (f foFigures) String() string {
	lag := make([]string, 0, len(f.lag))
	for _, l := range f.lag {
		lag = append(lag, fmt.Sprintf("%.2f MiB", float64(l)/(1<<20)))
	}
	slices.Sort(lag)
	return fmt.Sprintf("ops %d, keys %d, results %d, executions %d, "+
		"duplicates %d (%d reran a fence, %d ran after a result), lost %d (%d only ever replayed, %d unreadable), "+
		"replica lag at kill %v, bytes the promoted replica missed %d, failover %v, took %v",
		f.ops, f.keys, f.results, f.execs, f.duplicates, f.sameFence, f.afterValue, f.lost, f.onlyReplay, f.unreadable,
		lag, f.missed, f.failover.Round(time.Millisecond), f.took.Round(time.Millisecond))
}

// runFailover runs the scenario once with the store options given and
// asserts that it really tested something: both replicas lagged, a replica
// was promoted, traffic went on against it.
func runFailover(t *testing.T, opts ...idem.RedisOption) foFigures {
	start := time.Now()
	f := redistest.StartFailover(t)
	ctx := context.Background()
	l := newFoLog()

	guard := func(o *redis.FailoverOptions) *idem.Guard {
		c := redis.NewFailoverClient(o)
		t.Cleanup(func() { _ = c.Close() })
		return idem.New(idem.NewRedisStore(c, opts...), idem.WithLease(foLease), quiet)
	}
	fifo := f.FailoverOptions()
	fifo.PoolFIFO = true // with warm idle connections, the next command takes another one
	fifo.MinIdleConns = foWorkers
	fifo.PoolSize = 2 * foWorkers
	guards := []*idem.Guard{guard(f.FailoverOptions()), guard(fifo), guard(f.FailoverOptions())}

	stop := make(chan struct{})
	var ops atomic.Int64
	var wg sync.WaitGroup
	for _, g := range guards {
		for team := range foWorkers {
			wg.Go(func() {
				for n := 0; ; n++ {
					key := fmt.Sprintf("k%02d-%05d", team, n)
					v, first, ok, more := foCall(ctx, g, l, key, stop, &ops)
					if ok {
						l.handed(key, v, first)
					}
					if !more {
						return
					}
				}
			})
		}
	}
	stopped := false
	stopTraffic := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	t.Cleanup(stopTraffic) // also when an assertion ends the test early

	// Steady state, then freeze both replicas and write until they lag.
	l.waitKeys(t, 200)
	old := f.Primary(t)
	replicas := f.Replicas(t)
	require.Len(t, replicas, 2)
	keysFrozen := l.keyCount()
	for _, r := range replicas {
		r.Pause(t)
	}
	foBuildLag(t, old)
	keysLagging := l.keyCount()
	<-time.After(500 * time.Millisecond) // traffic against the lone primary
	var fig foFigures
	fig.lag = f.ReplicaLag(t)
	offset := old.Replication(t).Offset

	// kill -9, resume, wait for Sentinel to promote a replica.
	old.Kill(t)
	killed := time.Now()
	for _, r := range replicas {
		r.Resume(t)
	}
	promoted := f.WaitFailover(t, old, 20*time.Second)
	fig.failover = time.Since(killed)
	fig.missed = offset - promoted.Replication(t).SwitchOffset
	keysPromoted := l.keyCount()
	l.waitKeys(t, keysPromoted+200) // traffic goes on against the new primary
	stopTraffic()

	// Read every key that returned a result back on a fresh Guard.
	reader := guard(f.FailoverOptions())
	readback := foReadBack(ctx, reader, l)

	fig.ops = ops.Load()
	fig.took = time.Since(start)
	l.count(readback, &fig)
	t.Logf("keys with a result: %d before the freeze, %d once the replicas lagged, %d before the promotion, %d in all",
		keysFrozen, keysLagging, keysPromoted, fig.keys)

	require.Len(t, fig.lag, 2, "both replicas attached when the primary died: %v", fig)
	for _, r := range replicas {
		require.GreaterOrEqual(t, fig.lag[r.Addr()], int64(foMinLag), "replica %s lag: %v", r.Addr(), fig)
	}
	require.NotSame(t, old, promoted)
	require.Contains(t, replicas, promoted)
	require.GreaterOrEqual(t, fig.missed, int64(foMinLag), "the promoted replica lacked too little: %v", fig)
	return fig
}

// foReq is the request of one key.
type foReq struct{ Key string }

// foCall is one caller: it calls Do on key, retrying on every error with a
// short backoff, until it gets a result (ok; first when its own fn ran, else
// a replay), gives up after foKeyBudget, or stop is closed (more is false).
func foCall(ctx context.Context, g *idem.Guard, l *foLog, key string, stop <-chan struct{}, ops *atomic.Int64) (v string, first, ok, more bool) {
	deadline := time.Now().Add(foKeyBudget)
	backoff := 2 * time.Millisecond
	for {
		select {
		case <-stop:
			return "", false, false, false
		default:
		}
		ops.Add(1)
		ran := false
		v, err := idem.Do(ctx, g, key, foReq{key}, func(ctx context.Context, a *idem.Attempt) (string, error) {
			ran = true
			return l.fn(ctx, a)
		})
		if err == nil {
			return v, ran, true, true
		}
		if time.Now().After(deadline) {
			return "", false, false, true
		}
		timer := time.NewTimer(backoff)
		select {
		case <-stop:
			timer.Stop()
			return "", false, false, false
		case <-timer.C:
		}
		backoff = min(2*backoff, 50*time.Millisecond)
	}
}

// foBuildLag writes junk (64 KiB values that expire) to the frozen
// replicas' primary until it holds foMinLag bytes for each of them in its
// own output buffers: bytes that a kill -9 destroys. (Socket buffers take
// megabytes first, which the kernel delivers even after the primary died.)
func foBuildLag(t *testing.T, primary *redistest.Server) {
	t.Helper()
	c := primary.Client(t)
	value := make([]byte, 64<<10)
	deadline := time.Now().Add(foPhase)
	for i := 0; ; i++ {
		require.NoError(t, c.Set(context.Background(), fmt.Sprintf("junk:%d", i), value, time.Minute).Err())
		if i%4 != 3 {
			continue
		}
		unsent := primary.Unsent(t)
		// A margin: omem may count up to 16 KiB already sent.
		if len(unsent) == 2 && slices.Min(slices.Collect(maps.Values(unsent))) >= foMinLag+64<<10 {
			t.Logf("unsent bytes per replica after %d MiB of junk: %v", (i+1)/16, unsent)
			return
		}
		require.True(t, time.Now().Before(deadline), "replicas not %d bytes behind after %v: %v", foMinLag, foPhase, unsent)
	}
}

// foReadBack calls Do once more (retrying errors) on every key that returned
// a result, and returns what it got: the value, or "" when it kept failing.
func foReadBack(ctx context.Context, g *idem.Guard, l *foLog) map[string]string {
	keys := l.keys()
	got := make(map[string]string, len(keys))
	var mu sync.Mutex
	next := make(chan string)
	stop := make(chan struct{}) // never closed: every key is read
	var wg sync.WaitGroup
	for range foWorkers {
		wg.Go(func() {
			var ops atomic.Int64
			for key := range next {
				v, _, _, _ := foCall(ctx, g, l, key, stop, &ops)
				mu.Lock()
				got[key] = v
				mu.Unlock()
			}
		})
	}
	for _, k := range keys {
		next <- k
	}
	close(next)
	wg.Wait()
	return got
}

// foLog records every execution of fn and every result handed to a caller,
// with a sequence number that orders them.
type foLog struct {
	pad string // makes each stored result about 700 bytes

	mu      sync.Mutex
	seq     int64
	execs   map[string][]foExec
	results map[string]*foResults
	changed chan struct{} // a new key got a result
	nkeys   int
}

type foExec struct {
	fence int64
	seq   int64
}

type foResults struct {
	first  int64    // sequence number of the first hand-out
	values []string // distinct values handed out
	n      int64    // hand-outs
	firsts int      // hand-outs by the caller whose fn ran; the others are replays
}

func newFoLog() *foLog {
	b := make([]byte, 350)
	_, _ = rand.Read(b)
	return &foLog{
		pad:     hex.EncodeToString(b),
		execs:   make(map[string][]foExec),
		results: make(map[string]*foResults),
		changed: make(chan struct{}, 1),
	}
}

// fn is the operation's effect: it records its execution and returns a
// value unique to it.
func (l *foLog) fn(ctx context.Context, a *idem.Attempt) (string, error) {
	l.mu.Lock()
	l.seq++
	seq := l.seq
	l.execs[a.Key] = append(l.execs[a.Key], foExec{fence: a.Fence, seq: seq})
	l.mu.Unlock()
	time.Sleep(mrand.N(foEffect)) // the effect takes time, so operations span the freeze
	return fmt.Sprintf("%s/%d/%d/%s", a.Key, a.Fence, seq, l.pad), nil
}

// handed records that a caller got v for key. It is called after Do
// returned, so every execution with a later sequence number started after
// a caller had the result.
func (l *foLog) handed(key, v string, first bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	r := l.results[key]
	if r == nil {
		r = &foResults{first: l.seq}
		l.results[key] = r
		l.nkeys++
		select {
		case l.changed <- struct{}{}:
		default:
		}
	}
	r.n++
	if first {
		r.firsts++
	}
	if !slices.Contains(r.values, v) {
		r.values = append(r.values, v)
	}
}

func (l *foLog) keyCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nkeys
}

// keys returns the keys some caller got a result for.
func (l *foLog) keys() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Sorted(maps.Keys(l.results))
}

// waitKeys waits until n keys have had a result, for at most foPhase.
func (l *foLog) waitKeys(t *testing.T, n int) {
	t.Helper()
	timeout := time.After(foPhase)
	for l.keyCount() < n {
		select {
		case <-l.changed:
		case <-timeout:
			require.FailNow(t, "no progress", "%d keys with a result after %v, want %d", l.keyCount(), foPhase, n)
		}
	}
}

// count fills in the figures from the log and the values the read-back got
// (readback).
//
//   - A duplicated effect is an execution of fn for a (key, Attempt.Fence)
//     pair that already executed (the fence did not grow: a claim was lost),
//     or an execution of fn for a key after some caller had been handed a
//     result for it (first answer or replay). An execution that is both
//     counts once.
//   - A lost result is a key whose result was handed to some caller but
//     whose read-back does not replay that same result: fn ran again, the
//     read-back returned another value, or it kept failing. A key that was
//     handed two different values counts as lost too.
func (l *foLog) count(readback map[string]string, fig *foFigures) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fig.keys = l.nkeys
	for key, execs := range l.execs {
		fig.execs += len(execs)
		r := l.results[key]
		seen := make(map[int64]bool)
		for _, e := range execs {
			rerun, after := seen[e.fence], r != nil && r.first < e.seq
			if rerun || after {
				fig.duplicates++
			}
			if rerun {
				fig.sameFence++
			}
			if after {
				fig.afterValue++
			}
			seen[e.fence] = true
		}
	}
	for key, r := range l.results {
		fig.results += r.n
		got, ok := readback[key]
		if !ok {
			continue
		}
		if got == "" {
			fig.unreadable++
		}
		if len(r.values) != 1 || got != r.values[0] {
			fig.lost++
			if r.firsts == 0 {
				fig.onlyReplay++
			}
		}
	}
}
