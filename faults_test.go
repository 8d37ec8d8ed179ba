//go:build unix

package idem

// Fault tests on a real redis-server (package internal/redistest): processes
// that crash or freeze while holding a key, Redis going down before and
// during a run, replies lost after Redis executed a script (go-redis re-sends
// the command), leases lost to another owner, and a crowd of duplicates.
// Processes are real: a child is this test binary re-executed with
// faultChildEnv set, so it runs TestFaultChildProcess only.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/childtest"
	"github.com/idemkit/idem/internal/redistest"
)

// Environment of a child process.
const (
	faultChildEnv  = "IDEM_FAULT_CHILD" // role: "crash" or "freeze"
	faultAddrEnv   = "IDEM_FAULT_ADDR"
	faultPrefixEnv = "IDEM_FAULT_PREFIX"
	faultKeyEnv    = "IDEM_FAULT_KEY"
	faultLeaseEnv  = "IDEM_FAULT_LEASE"
)

// faultLease is the lease of the tests that wait for one to run out: long
// enough that a loaded machine renews it in time, short enough for a fast
// suite.
const faultLease = 400 * time.Millisecond

// faultReq is the request every fault test fingerprints.
type faultReq struct {
	Amount int `json:"amount"`
}

// faultEvent is a line a child process writes on stdout as JSON.
type faultEvent struct {
	Event       string `json:"event"` // "ready", "cancelled" or "result"
	Fence       int64  `json:"fence,omitempty"`
	Refused     int64  `json:"refused,omitempty"` // claims refused as late before the one that runs
	ID          string `json:"id,omitempty"`
	Value       string `json:"value,omitempty"`
	Err         string `json:"err,omitempty"`
	LeaseLost   bool   `json:"lease_lost,omitempty"`
	NotRecorded bool   `json:"not_recorded,omitempty"`
	Unavailable bool   `json:"unavailable,omitempty"`
}

// Name returns the event's name, for childtest.
func (e faultEvent) Name() string { return e.Event }

// quietLog discards the engine's log.
var quietLog = WithLogger(slog.New(slog.DiscardHandler))

// faultGuard returns a guard on c under prefix.
func faultGuard(c redis.UniversalClient, prefix string, opts ...Option) (*Guard, *RedisStore) {
	s := NewRedisStore(c, WithPrefix(prefix))
	return New(s, append([]Option{quietLog}, opts...)...), s
}

// fastFailOptions makes a client give up quickly on a Redis that is down,
// where the defaults retry dials and commands for seconds.
func fastFailOptions(o *redis.Options) *redis.Options {
	o.DialTimeout = 200 * time.Millisecond
	o.DialerRetries = 1
	o.DialerRetryTimeout = 5 * time.Millisecond
	o.MaxRetries = 1
	o.MinRetryBackoff = 5 * time.Millisecond
	o.MaxRetryBackoff = 20 * time.Millisecond
	o.ReadTimeout = time.Second
	o.WriteTimeout = time.Second
	return o
}

// opID returns the id of the Do operation on key.
func opID(key string) string { return operationID(KindDo, "", key) }

// TestFaultChildProcess is the body of the child processes; run directly, it
// skips.
func TestFaultChildProcess(t *testing.T) {
	role := os.Getenv(faultChildEnv)
	if role == "" {
		t.Skip("helper process for the fault tests")
	}
	if err := runFaultChild(role); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	os.Exit(0)
}

func runFaultChild(role string) error {
	lease, err := time.ParseDuration(os.Getenv(faultLeaseEnv))
	if err != nil {
		return err
	}
	c := redis.NewClient(&redis.Options{Addr: os.Getenv(faultAddrEnv)})
	defer c.Close()
	g, _ := faultGuard(c, os.Getenv(faultPrefixEnv), WithLease(lease))
	out := json.NewEncoder(os.Stdout)
	// A child the parent forgot is gone after a while.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// A claim the library found answered past its lease (a loaded
	// machine) ran nothing: claim again, and tell the parent how many
	// claims took a fence before.
	var v string
	for refused := int64(0); refused < 10; refused++ {
		v, err = Do(ctx, g, os.Getenv(faultKeyEnv), faultReq{Amount: 100}, childFn(role, out, refused))
		if !refusedLate(err) {
			break
		}
	}
	ev := faultEvent{Event: "result", Value: v}
	if err != nil {
		ev.Err = err.Error()
		ev.LeaseLost = errors.Is(err, ErrLeaseLost)
		ev.NotRecorded = errors.Is(err, ErrNotRecorded)
		ev.Unavailable = errors.Is(err, ErrStoreUnavailable)
	}
	return out.Encode(ev)
}

// childFn is the function of a child process in role, which tells the
// parent where it is on out.
func childFn(role string, out *json.Encoder, refused int64) func(ctx context.Context, a *Attempt) (string, error) {
	return func(ctx context.Context, a *Attempt) (string, error) {
		if err := a.Checkpoint(ctx, "charge_id", []byte("ch_child")); err != nil {
			return "", err
		}
		if err := out.Encode(faultEvent{Event: "ready", Fence: a.Fence, Refused: refused, ID: a.ID}); err != nil {
			return "", err
		}
		switch role {
		case "crash": // wait for SIGKILL
			<-ctx.Done()
			return "", errors.New("child: not killed in time")
		case "freeze": // SIGSTOP, SIGCONT, and then finish regardless
			<-ctx.Done()
			cause := context.Cause(ctx)
			_ = out.Encode(faultEvent{Event: "cancelled", Err: cause.Error(), LeaseLost: errors.Is(cause, ErrLeaseLost)})
			return "child", nil
		}
		return "", fmt.Errorf("child: unknown role %q", role)
	}
}

// startFaultChild runs this test binary as a child in role, working on key.
func startFaultChild(t *testing.T, role string, srv *redistest.Server, prefix, key string, lease time.Duration) *childtest.Child[faultEvent] {
	t.Helper()
	return childtest.Start[faultEvent](t, "TestFaultChildProcess", 30*time.Second,
		faultChildEnv+"="+role,
		faultAddrEnv+"="+srv.Addr(),
		faultPrefixEnv+"="+prefix,
		faultKeyEnv+"="+key,
		faultLeaseEnv+"="+lease.String(),
	)
}

// waitLeaseGone polls until the lease of id is gone and returns how long
// that took; it fails after limit.
func waitLeaseGone(t *testing.T, s *RedisStore, id string, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		r, err := s.Read(context.Background(), id)
		require.NoError(t, err)
		if r == nil || r.LeaseTTL == 0 {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			t.Fatalf("lease of %s still held after %v (%v left)", id, limit, r.LeaseTTL)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFaultCrashedHolder: a process claims a key, saves a checkpoint and is
// SIGKILLed. Until its lease runs out a retry is told to wait; then the retry
// takes over with Fence 2 and the dead attempt's checkpoint, and its result
// is the one replayed.
func TestFaultCrashedHolder(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	prefix := redistest.Prefix(t)
	// The parent's lease is one that no claim's reply outlasts on a loaded
	// machine: its functions return at once.
	g, store := faultGuard(srv.Client(t), prefix, WithLease(time.Minute))
	ctx := context.Background()
	const key = "crash-key"
	req := faultReq{Amount: 100}

	// The dead holder's lease must still be live when the retry below
	// reaches Redis, right after the kill: the child renews it every third
	// of crashLease, so at least two seconds are left, six times the
	// longest stall seen on a loaded 2-core machine (faultLease left only
	// 270ms). The test then waits the rest of it out.
	const crashLease = 3 * time.Second
	child := startFaultChild(t, "crash", srv, prefix, key, crashLease)
	ready := child.Next(t, "ready")
	require.Equal(t, int64(1), ready.Fence, "the first claim to run, after %d refused as late and taken back", ready.Refused)
	require.Equal(t, opID(key), ready.ID)
	child.Signal(t, syscall.SIGKILL)
	require.Error(t, child.Wait(t))
	// The lease's expiry on the server's clock, from now on.
	rc, lk := srv.Client(t), leaseKey(prefix, ready.ID)
	leaseEnd, err := rc.PExpireTime(ctx, lk).Result()
	require.NoError(t, err)
	require.Positive(t, leaseEnd)

	ran := false
	_, err = Do(ctx, g, key, req, func(context.Context, *Attempt) (string, error) {
		ran = true
		return "too early", nil
	})
	require.False(t, ran, "the dead holder's lease is still live")
	require.ErrorIs(t, err, ErrInProgress)
	var busy *InProgressError
	require.ErrorAs(t, err, &busy)
	require.Greater(t, busy.RetryAfter, time.Duration(0))
	require.LessOrEqual(t, busy.RetryAfter, crashLease)

	rec, err := store.Read(ctx, ready.ID)
	require.NoError(t, err)
	require.Equal(t, idemstore.StateInProgress, rec.State)
	require.Equal(t, []byte("ch_child"), rec.Checkpoints["charge_id"])

	// Nobody renews a dead holder's lease: its expiry never moves until it
	// is gone (a lease's expiry is no event: poll the server).
	for {
		end, err := rc.PExpireTime(ctx, lk).Result()
		require.NoError(t, err)
		if end == -2 { // no such key
			break
		}
		require.Equal(t, leaseEnd, end, "the dead holder's lease was renewed")
		time.Sleep(10 * time.Millisecond)
	}

	v, err := Do(ctx, g, key, req, func(ctx context.Context, a *Attempt) (string, error) {
		require.Equal(t, ready.Fence+1, a.Fence)
		require.Equal(t, ready.ID, a.ID)
		require.Equal(t, map[string][]byte{"charge_id": []byte("ch_child")}, a.Checkpoints())
		return "reconciled " + string(a.Checkpoints()["charge_id"]), nil
	})
	require.NoError(t, err)
	require.Equal(t, "reconciled ch_child", v)

	v, err = Do(ctx, g, key, req, func(context.Context, *Attempt) (string, error) {
		t.Error("a completed key ran again")
		return "", nil
	})
	require.NoError(t, err)
	require.Equal(t, "reconciled ch_child", v)
}

// TestFaultFrozenHolder: a process claims a key and is SIGSTOPped past its
// lease; another takes over and completes. When the frozen process resumes,
// its context ends with ErrLeaseLost and its own result is refused
// (ErrNotRecorded with ErrLeaseLost); the stored result stays the
// taker's.
func TestFaultFrozenHolder(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	prefix := redistest.Prefix(t)
	ctx := context.Background()
	const key = "freeze-key"
	req := faultReq{Amount: 100}

	child := startFaultChild(t, "freeze", srv, prefix, key, faultLease)
	ready := child.Next(t, "ready")
	require.Equal(t, int64(1), ready.Fence, "the first claim to run, after %d refused as late and taken back", ready.Refused)
	child.Signal(t, syscall.SIGSTOP)
	// The frozen lease's end, on the server's clock: its expiry, or now if
	// it ran out already.
	rc := srv.Client(t)
	leaseEnd, err := rc.Time(ctx).Result()
	require.NoError(t, err)
	if end, err := rc.PExpireTime(ctx, leaseKey(prefix, ready.ID)).Result(); err == nil && end > 0 {
		leaseEnd = time.UnixMilli(end.Milliseconds())
	}

	// A waiting duplicate takes the key over once the frozen lease runs out.
	// Its own lease is one that no claim's reply outlasts on a loaded
	// machine: its function returns at once.
	g, store := faultGuard(rc, prefix, WithLease(time.Minute), WithWait(5*time.Second))
	var took time.Time // when the taker ran, on the server's clock
	v, err := Do(ctx, g, key, req, func(ctx context.Context, a *Attempt) (string, error) {
		require.Equal(t, ready.Fence+1, a.Fence)
		require.Equal(t, []byte("ch_child"), a.Checkpoints()["charge_id"])
		var err error
		took, err = rc.Time(ctx).Result()
		require.NoError(t, err)
		return "parent", nil
	})
	require.NoError(t, err)
	require.Equal(t, "parent", v)
	// The waiter woke when the lease ran out, as Redis told it (RetryAfter),
	// not at its next check of its own, watchPoll on: by the server's clock,
	// which no stall of this process moves, the takeover came well before.
	require.Less(t, took.Sub(leaseEnd), watchPoll, "the waiter took over %v after the lease ended", took.Sub(leaseEnd))

	child.Signal(t, syscall.SIGCONT)
	cancelled := child.Next(t, "cancelled")
	require.True(t, cancelled.LeaseLost, "the resumed holder's context cause: %s", cancelled.Err)
	res := child.Next(t, "result")
	require.Equal(t, "child", res.Value, "Do returns fn's value alongside ErrNotRecorded")
	require.True(t, res.NotRecorded, "child error: %s", res.Err)
	require.True(t, res.LeaseLost, "child error: %s", res.Err)
	require.False(t, res.Unavailable, "child error: %s", res.Err)
	require.NoError(t, child.Wait(t), child.Stderr())

	rec, err := store.Read(ctx, ready.ID)
	require.NoError(t, err)
	require.Equal(t, idemstore.StateCompleted, rec.State)
	require.Equal(t, ready.Fence+1, rec.Fence)
	v, err = Do(ctx, g, key, req, func(context.Context, *Attempt) (string, error) {
		t.Error("a completed key ran again")
		return "", nil
	})
	require.NoError(t, err)
	require.Equal(t, "parent", v)
}

// TestFaultRedisDownBefore: with Redis down, Do fails closed: fn does not
// run and the error is ErrStoreUnavailable without ErrNotRecorded.
func TestFaultRedisDownBefore(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := redis.NewClient(fastFailOptions(srv.Options()))
	t.Cleanup(func() { _ = c.Close() })
	// A lease no claim's reply outlasts on a loaded machine: none runs out
	// here.
	g, _ := faultGuard(c, "idem", WithLease(time.Minute))
	ctx := context.Background()

	srv.Stop(t)
	ran := false
	start := time.Now()
	_, err := Do(ctx, g, "k", faultReq{Amount: 1}, func(context.Context, *Attempt) (string, error) {
		ran = true
		return "x", nil
	})
	require.False(t, ran)
	require.ErrorIs(t, err, ErrStoreUnavailable)
	require.NotErrorIs(t, err, ErrNotRecorded)
	require.Less(t, time.Since(start), 5*time.Second, "fails fast, not after go-redis's default retries")

	ranOnce := false
	done, err := g.Once(ctx, "m", func(context.Context) error { ranOnce = true; return nil })
	require.False(t, done)
	require.False(t, ranOnce)
	require.ErrorIs(t, err, ErrStoreUnavailable)

	srv.Restart(t)
	v, err := Do(ctx, g, "k", faultReq{Amount: 1}, func(ctx context.Context, a *Attempt) (string, error) {
		require.Equal(t, int64(1), a.Fence)
		return "x", nil
	})
	require.NoError(t, err)
	require.Equal(t, "x", v)
}

// TestFaultRedisDownMidway: Redis goes down while fn runs. fn's value comes
// back with ErrNotRecorded joined with ErrStoreUnavailable, and the
// completion goes on in the background until the lease ends. Once Redis is
// back (with its data) after the lease, a retry runs with Fence 2 and the
// checkpoint.
func TestFaultRedisDownMidway(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := redis.NewClient(fastFailOptions(srv.Options()))
	t.Cleanup(func() { _ = c.Close() })
	g, store := faultGuard(c, "idem", WithLease(faultLease))
	ctx := context.Background()
	req := faultReq{Amount: 7}

	runs := 0
	var fence int64
	v, refused, err := doInTime(t, ctx, g, "k", req, func(ctx context.Context, a *Attempt) (string, error) {
		runs++
		fence = a.Fence
		require.NoError(t, a.Checkpoint(ctx, "charge_id", []byte("ch_1")))
		srv.Stop(t) // saves the data: the claim survives the restart
		return "charged", nil
	})
	require.Equal(t, 1, runs)
	require.Equal(t, int64(1), fence, "the first claim to run, after %d refused as late and taken back", refused)
	require.Equal(t, "charged", v, "fn's value is returned with ErrNotRecorded")
	require.ErrorIs(t, err, ErrNotRecorded)
	require.ErrorIs(t, err, ErrStoreUnavailable)
	require.NotErrorIs(t, err, ErrLeaseLost)
	// The completion goes on in the background until the lease ends; Redis
	// stays down until then, so it is not stored.
	require.NoError(t, g.Drain(ctx))

	srv.Restart(t)
	waitLeaseGone(t, store, opID("k"), time.Minute) // a hang guard: the lease ends within faultLease
	var retryFence int64
	v, refused, err = doInTime(t, ctx, g, "k", req, func(ctx context.Context, a *Attempt) (string, error) {
		runs++
		retryFence = a.Fence
		require.Equal(t, []byte("ch_1"), a.Checkpoints()["charge_id"])
		return "reconciled", nil
	})
	require.NoError(t, err)
	require.Equal(t, "reconciled", v)
	require.Equal(t, 2, runs)
	require.Equal(t, fence+1, retryFence, "the next claim to run, after %d refused as late and taken back", refused)
}

// TestFaultDroppedReply loses the reply to each script after Redis ran it;
// go-redis re-sends the command with the same owner token. Every script must
// be idempotent for its owner: fn runs once per Do, the result is right, the
// lease stays the holder's (its heartbeat is answered "held"), and no second
// run is needed or blocked.
//
// The re-sent command answers later than the first would have: on a loaded
// machine, after the lease it set, measured from when it was sent. The
// library then decides the lease is lost (a claim refused, fn's context
// cancelled), as it must; that try proves nothing about the re-send, and the
// case is tried again on a fresh key. What never depends on time is checked
// in every try: the store never answers "lease lost" while the holder's
// lease was certainly live in Redis.
func TestFaultDroppedReply(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		script string
	}{
		{name: "claim", script: claimLua},
		{name: "checkpoint", script: checkpointLua},
		{name: "heartbeat", script: heartbeatLua},
		{name: "complete", script: completeLua},
		{name: "release", script: releaseLua},
	}
	for _, tt := range tests {
		for _, pipelined := range []bool{false, true} {
			name := tt.name
			if pipelined {
				name += "/auto-pipelined"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				srv := redistest.Shared(t)
				d := redistest.NewReplyDropper(redistest.MatchScript(tt.script), 0)
				opts := srv.Options()
				opts.Dialer = d.Dial
				opts.MaxRetries = 3
				c := redis.NewClient(opts)
				t.Cleanup(func() { _ = c.Close() })
				const lease = 300 * time.Millisecond
				store := NewRedisStore(c, WithPrefix(redistest.Prefix(t)))
				if pipelined {
					store = PipelineEveryCall(NewRedisStore(c, WithPrefix(redistest.Prefix(t)), WithAutoPipeline()))
				}
				const tries = 10
				for try := 1; ; try++ {
					require.LessOrEqual(t, try, tries, "in each of %d tries the library found a reply later than its lease", tries)
					if droppedReplyTry(t, tt.name, store, d, lease, fmt.Sprintf("k%d", try)) {
						if try > 1 {
							t.Logf("proven at try %d: the library found a reply late in the tries before", try)
						}
						return
					}
				}
			})
		}
	}
}

// droppedReplyTry runs one try of TestFaultDroppedReply on key: it drops the
// reply of the first run of script and reports whether the try proved the
// case, false when the library found a reply later than its lease.
func droppedReplyTry(t *testing.T, script string, store *RedisStore, d *redistest.ReplyDropper, lease time.Duration, key string) (proven bool) {
	t.Helper()
	w := &answerLog{Store: store, lease: lease, beats: make(chan error, 64)}
	g := New(w, quietLog, WithLease(lease))
	ctx := context.Background()
	req := faultReq{Amount: 3}
	dropped := d.Dropped()
	d.Arm(1)
	defer d.Arm(0)

	var runs atomic.Int32
	late := false // the library found its lease late while fn ran
	fn := func(ctx context.Context, a *Attempt) (string, error) {
		n := runs.Add(1)
		for len(w.beats) > 0 { // the answers to renewals before fn began
			<-w.beats
		}
		if err := a.Checkpoint(ctx, "step", []byte("charged")); err != nil {
			require.ErrorIs(t, context.Cause(ctx), ErrLeaseLost, "the checkpoint failed (%v) on a lease the library still held", err)
			late = true
			return "", err
		}
		// Wait for a heartbeat (lease/3 after the claim was sent) answered
		// "held", or for the library to stop trusting the lease.
		for held := false; !held; {
			select {
			case err := <-w.beats:
				held = err == nil
			case <-ctx.Done():
				require.Equal(t, ErrLeaseLost, context.Cause(ctx))
				late = true
				return "", ctx.Err()
			}
		}
		if script == "release" && n == 1 {
			return "", errors.New("transient") // released
		}
		return fmt.Sprintf("done at fence %d", a.Fence), nil
	}
	v, err := Do(ctx, g, key, req, fn)
	w.requireNoEarlyLoss(t)
	if refusedLate(err) {
		require.Zero(t, runs.Load(), "fn ran on a claim the library refused")
		return false
	}
	if late {
		return false
	}
	if script == "release" {
		require.EqualError(t, err, "transient")
		require.Equal(t, dropped+1, d.Dropped(), "the release reply was dropped")
		// The re-sent release must not fail: the key is free at once.
		v, err = Do(ctx, g, key, req, fn)
		w.requireNoEarlyLoss(t)
		if refusedLate(err) || late {
			return false
		}
		require.NoError(t, err)
		require.Equal(t, "done at fence 2", v)
		require.Equal(t, int32(2), runs.Load())
	} else {
		require.NoError(t, err)
		require.Equal(t, "done at fence 1", v, "a re-sent claim must not count as a takeover")
		require.Equal(t, int32(1), runs.Load())
		require.Equal(t, dropped+1, d.Dropped(), "the %s reply was dropped", script)
	}

	v2, err := Do(ctx, g, key, req, func(context.Context, *Attempt) (string, error) {
		t.Error("a completed key ran again")
		return "", nil
	})
	require.NoError(t, err)
	require.Equal(t, v, v2)
	rec, err := store.Read(ctx, opID(key))
	require.NoError(t, err)
	require.Equal(t, idemstore.StateCompleted, rec.State)
	require.Zero(t, rec.LeaseTTL, "completion drops the lease")
	return true
}

// refusedLate reports whether err is the library refusing a claim whose
// reply (or the renewal that followed it) came after the lease it set,
// measured from when it was sent: fn did not run.
func refusedLate(err error) bool {
	return errors.Is(err, ErrStoreUnavailable) && errors.Is(err, ErrLeaseLost) && !errors.Is(err, ErrNotRecorded)
}

// doInTime calls Do until the library does not refuse its claim as
// answered past the lease it set, measured from when it was sent (as a
// loaded machine makes it), at most ten times; a call refused at once by
// fail-fast (a store that was failing and has not been probed since it
// came back) is made again after a probe's pause, and not counted. It
// returns the outcome of the last call and the number of claims refused as
// late before it: they ran nothing, and each was taken back, so the claim
// that ran has the fence the first would have had.
func doInTime[T any](t *testing.T, ctx context.Context, g *Guard, key string, req any, fn func(context.Context, *Attempt) (T, error)) (v T, refused int64, err error) {
	t.Helper()
	for failing := 0; ; {
		v, err = Do(ctx, g, key, req, fn)
		if errors.As(err, new(*failingError)) {
			failing++
			require.Less(t, failing, 100, "fail-fast refused every call for 10s: %v", err)
			time.Sleep(probeEvery)
			continue
		}
		if !refusedLate(err) {
			return v, refused, err
		}
		refused++
		require.Less(t, refused, int64(10), "the library found every claim late: %v", err)
	}
}

// answerLog is a store that tells a test what the store answered, apart
// from what the library decided about time: every heartbeat's answer (on
// beats), and the answers "lease lost" that came while the holder's lease
// was certainly live in Redis, less than a lease after its claim was sent
// (Redis starts the lease when the claim arrives, and renewals only extend
// it). In the tests that use it nobody else claims the key, so such an
// answer means a re-sent script took its own owner's lease or record for
// another's.
type answerLog struct {
	idemstore.Store
	lease time.Duration
	beats chan error

	mu      sync.Mutex
	claimed time.Time // when the last claim was sent
	early   []string  // "lease lost" answers while the lease was live
}

func (w *answerLog) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	w.mu.Lock()
	w.claimed = time.Now()
	w.mu.Unlock()
	return w.Store.Claim(ctx, id, c)
}

func (w *answerLog) Heartbeat(ctx context.Context, id, owner string, lease time.Duration) error {
	err := w.note("heartbeat", w.Store.Heartbeat(ctx, id, owner, lease))
	select {
	case w.beats <- err:
	default:
	}
	return err
}

func (w *answerLog) Checkpoint(ctx context.Context, id, owner, name string, value []byte) error {
	return w.note("checkpoint", w.Store.Checkpoint(ctx, id, owner, name, value))
}

func (w *answerLog) Complete(ctx context.Context, id, owner string, payload []byte, retention time.Duration) error {
	return w.note("complete", w.Store.Complete(ctx, id, owner, payload, retention))
}

func (w *answerLog) Release(ctx context.Context, id, owner string) error {
	return w.note("release", w.Store.Release(ctx, id, owner))
}

// note records err, the answer of op, if it is a "lease lost" that came
// while the lease was live.
func (w *answerLog) note(op string, err error) error {
	if errors.Is(err, ErrLeaseLost) {
		w.mu.Lock()
		if since := time.Since(w.claimed); since < w.lease {
			w.early = append(w.early, fmt.Sprintf("%s answered %q %v after the claim was sent", op, err, since.Round(time.Millisecond)))
		}
		w.mu.Unlock()
	}
	return err
}

// requireNoEarlyLoss fails when the store answered "lease lost" while the
// lease was live.
func (w *answerLog) requireNoEarlyLoss(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	require.Empty(t, w.early, "the store found the holder's own lease or record taken")
}

// TestFaultLeaseLost: when the lease key is taken from the holder behind its
// back, the next heartbeat (within lease/3) cancels fn's context with cause
// ErrLeaseLost, and a result fn returns anyway is not stored over another
// owner's claim.
func TestFaultLeaseLost(t *testing.T) {
	t.Parallel()
	const lease = 300 * time.Millisecond
	tests := []struct {
		name  string
		steal func(ctx context.Context, t *testing.T, c *redis.Client, s *RedisStore, id, leaseKey string)
		// another owner holds the record afterwards
		takenOver bool
	}{
		{
			name: "lease deleted",
			steal: func(ctx context.Context, t *testing.T, c *redis.Client, s *RedisStore, id, leaseKey string) {
				require.NoError(t, c.Del(ctx, leaseKey).Err())
			},
		},
		{
			name: "lease overwritten",
			steal: func(ctx context.Context, t *testing.T, c *redis.Client, s *RedisStore, id, leaseKey string) {
				require.NoError(t, c.Set(ctx, leaseKey, "intruder", time.Minute).Err())
			},
		},
		{
			name: "taken over",
			steal: func(ctx context.Context, t *testing.T, c *redis.Client, s *RedisStore, id, leaseKey string) {
				require.NoError(t, c.Del(ctx, leaseKey).Err())
				rec, err := s.Read(ctx, id)
				require.NoError(t, err)
				res, err := s.Claim(ctx, id, idemstore.ClaimRequest{Owner: "intruder", Fingerprint: rec.Fingerprint, Lease: time.Minute, TTL: time.Hour})
				require.NoError(t, err)
				require.Equal(t, idemstore.ClaimOK, res.Status)
				require.Equal(t, rec.Fence+1, res.Fence)
			},
			takenOver: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Shared(t)
			c := srv.Client(t)
			prefix := redistest.Prefix(t)
			store := NewRedisStore(c, WithPrefix(prefix))
			beats := &heartbeatCounter{RedisStore: store}
			g := New(beats, quietLog, WithLease(lease))
			ctx := context.Background()

			var detected int32 // renewals sent after the steal
			var fence int64    // the holder's
			v, _, err := doInTime(t, ctx, g, "k", faultReq{}, func(ctx context.Context, a *Attempt) (string, error) {
				fence = a.Fence
				// The thief's calls use their own context: once the lease key
				// is gone, the next heartbeat may cancel fn's at any moment.
				tt.steal(context.Background(), t, c, store, a.ID, leaseKey(prefix, a.ID))
				stolen := beats.n.Load()
				select {
				case <-ctx.Done():
					detected = beats.n.Load() - stolen
				case <-time.After(10 * time.Second):
					t.Error("fn's context was not cancelled")
				}
				require.ErrorIs(t, context.Cause(ctx), ErrLeaseLost)
				require.Equal(t, ErrLeaseLost, context.Cause(ctx))
				return "stale", nil
			})
			// A renewal in flight during the steal may notice it; otherwise the
			// next one, sent lease/3 later, does.
			require.LessOrEqual(t, detected, int32(1), "the next heartbeat notices")
			require.Equal(t, "stale", v)
			rec, rerr := store.Read(ctx, opID("k"))
			require.NoError(t, rerr)
			if tt.takenOver {
				require.ErrorIs(t, err, ErrNotRecorded)
				require.ErrorIs(t, err, ErrLeaseLost)
				require.Equal(t, idemstore.StateInProgress, rec.State)
				require.Equal(t, "intruder", rec.Owner)
				require.Equal(t, fence+1, rec.Fence)
			} else if err == nil {
				// Nobody else claimed the record: the holder's result may
				// still be stored; what matters is that it is consistent.
				require.Equal(t, idemstore.StateCompleted, rec.State)
			} else {
				require.ErrorIs(t, err, ErrNotRecorded)
			}
		})
	}
}

// TestFaultRedisHangs: Redis stops answering (SIGSTOP) while fn runs. The
// holder cannot renew its lease, so by the end of the lease, measured
// locally, fn's context must be cancelled with ErrLeaseLost: from then on
// another process may take the key over, and two holders would run at once.
// It must hold for a client with go-redis defaults too, which apply
// ReadTimeout (3s) to sockets and ignore context deadlines, so a renewal in
// flight blocks for seconds. (Regression test: the engine used to wait for
// that renewal before checking its local deadline; fn ran 3s and more.)
func TestFaultRedisHangs(t *testing.T) {
	t.Parallel()
	const lease = 150 * time.Millisecond // ten leases stay well below go-redis's ReadTimeout (3s)
	tests := []struct {
		name string
		opts func(*redis.Options)
	}{
		{name: "go-redis defaults", opts: func(*redis.Options) {}},
		{name: "ContextTimeoutEnabled", opts: func(o *redis.Options) { o.ContextTimeoutEnabled = true }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			opts := srv.Options()
			tt.opts(opts)
			c := redis.NewClient(opts)
			t.Cleanup(func() { _ = c.Close() })
			g, _ := faultGuard(c, "idem", WithLease(lease))

			var start, fnEnd time.Time
			_, _, err := doInTime(t, context.Background(), g, "k", faultReq{}, func(ctx context.Context, a *Attempt) (string, error) {
				start = time.Now() // the lease was measured from a little earlier, when the claim was sent
				srv.Pause(t)
				defer srv.Resume(t)
				select {
				case <-ctx.Done():
				case <-time.After(3 * time.Second):
				}
				fnEnd = time.Now()
				return "", context.Cause(ctx)
			})
			returned := time.Since(start)
			ranFor := fnEnd.Sub(start)
			require.False(t, start.IsZero(), "fn did not run")
			require.ErrorIs(t, err, ErrLeaseLost, "fn's context was not cancelled within %v of a %v lease", ranFor, lease)
			// Generous, for any load: ten leases, where the defect waited
			// for the renewal's ReadTimeout, 3s.
			require.LessOrEqual(t, ranFor, 10*lease,
				"fn ran %v under a %v lease while Redis did not answer", ranFor, lease)
			require.LessOrEqual(t, returned, ranFor+time.Second, "Do returned %v after fn", returned-ranFor)
		})
	}
}

// TestFaultCheckpointAfterLeaseLost: once another attempt took the key
// over, the stale holder's Checkpoint reports ErrLeaseLost, also when it
// passes fn's own context, which the engine cancelled for that very reason:
// the store was reachable, so ErrStoreUnavailable would send the caller the
// wrong way. (Regression test: it used to be "store unavailable: context
// canceled".)
func TestFaultCheckpointAfterLeaseLost(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	c := srv.Client(t)
	prefix := redistest.Prefix(t)
	g, store := faultGuard(c, prefix, WithLease(300*time.Millisecond))
	_, _, err := doInTime(t, context.Background(), g, "k", faultReq{}, func(ctx context.Context, a *Attempt) (string, error) {
		// The intruder's calls use their own context: once the lease key is
		// gone, the next heartbeat may cancel fn's context at any moment.
		bg := context.Background()
		require.NoError(t, c.Del(bg, leaseKey(prefix, a.ID)).Err())
		rec, err := store.Read(bg, a.ID)
		require.NoError(t, err)
		res, err := store.Claim(bg, a.ID, idemstore.ClaimRequest{Owner: "intruder", Fingerprint: rec.Fingerprint, Lease: time.Minute, TTL: time.Hour})
		require.NoError(t, err)
		require.Equal(t, idemstore.ClaimOK, res.Status)
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second): // a hang guard: the next heartbeat, 100ms on, notices
			t.Error("fn's context was not cancelled")
		}

		err = a.Checkpoint(context.Background(), "late", []byte("v"))
		require.ErrorIs(t, err, ErrLeaseLost, "with a live context")
		err = a.Checkpoint(ctx, "late", []byte("v"))
		require.ErrorIs(t, err, ErrLeaseLost, "with fn's context, cancelled because the lease was lost")
		require.NotErrorIs(t, err, ErrStoreUnavailable)
		return "", context.Cause(ctx)
	})
	require.ErrorIs(t, err, ErrLeaseLost)
}

// TestFaultLateResentClaim: the reply to a claim is lost and go-redis
// re-sends it only after the lease has run out (a retry backoff longer than
// the lease). The re-sent claim finds the record still naming its owner and
// reports ClaimOK, although the lease key is gone, so that any other process
// may claim the key at that moment. fn must never start without a live
// lease: cancelling fn's context from the heartbeat goroutine is not enough,
// as fn may already have begun its side effect. (Regression test: the
// engine used to run fn here with the lease key gone.)
func TestFaultLateResentClaim(t *testing.T) {
	t.Parallel()
	const lease = 300 * time.Millisecond
	srv := redistest.Shared(t)
	d := redistest.NewReplyDropper(redistest.MatchScript(claimLua), 1)
	opts := srv.Options()
	opts.Dialer = d.Dial
	opts.MinRetryBackoff = lease + 200*time.Millisecond
	opts.MaxRetryBackoff = lease + 200*time.Millisecond
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	prefix := redistest.Prefix(t)
	g, store := faultGuard(c, prefix, WithLease(lease))

	sent := time.Now()
	_, _ = Do(context.Background(), g, "k", faultReq{}, func(ctx context.Context, a *Attempt) (string, error) {
		// Whether ctx is already cancelled here is a race with the
		// heartbeat goroutine; a side effect may have started either way.
		rec, err := store.Read(context.Background(), a.ID)
		require.NoError(t, err)
		require.Equal(t, 1, d.Dropped())
		require.Greater(t, rec.LeaseTTL, time.Duration(0),
			"fn started %v after the claim was sent, past its %v lease, with no lease in Redis: another process can claim the key now",
			time.Since(sent), lease)
		return "", errors.New("stop")
	})
}

// TestFaultRedisLosesData: Redis restarts without its data (a crash without
// persistence, or a failover to a replica that missed the claim) while fn
// runs. The holder is not the record's owner any more: its context is
// cancelled with ErrLeaseLost and its result reported unrecorded; a retry
// runs anew, at Fence 1, without the lost checkpoints. This is the limit of
// the guarantee, documented in the README.
func TestFaultRedisLosesData(t *testing.T) {
	t.Parallel()
	const lease = 300 * time.Millisecond
	srv := redistest.Start(t)
	c := redis.NewClient(fastFailOptions(srv.Options()))
	t.Cleanup(func() { _ = c.Close() })
	g, _ := faultGuard(c, "idem", WithLease(lease))
	ctx := context.Background()

	v, _, err := doInTime(t, ctx, g, "k", faultReq{}, func(ctx context.Context, a *Attempt) (string, error) {
		require.NoError(t, a.Checkpoint(ctx, "charge_id", []byte("ch_1")))
		srv.Kill(t)
		srv.Restart(t)
		select {
		case <-ctx.Done():
			require.Equal(t, ErrLeaseLost, context.Cause(ctx))
		case <-time.After(10 * time.Second): // a hang guard: the lease ends first
			t.Error("fn's context was not cancelled")
		}
		return "charged", nil
	})
	require.Equal(t, "charged", v)
	require.ErrorIs(t, err, ErrNotRecorded)
	require.ErrorIs(t, err, ErrLeaseLost)

	var fence int64
	v, refused, err := doInTime(t, ctx, g, "k", faultReq{}, func(ctx context.Context, a *Attempt) (string, error) {
		fence = a.Fence
		require.Empty(t, a.Checkpoints())
		return "charged again", nil
	})
	require.NoError(t, err)
	require.Equal(t, "charged again", v)
	require.Equal(t, int64(1), fence, "the record is gone: the key is new (%d claims refused as late since, and taken back)", refused)
}

// TestFaultWaitersTakeOver: a holder died with the key claimed; 32 waiting
// duplicates (WithWait) race for the key when its lease runs out. Exactly one
// takes it over, with Fence 2 and the checkpoint, and all get its result.
func TestFaultWaitersTakeOver(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	const lease = 300 * time.Millisecond
	// The dead holder's lease is short, to be waited out; the taker's is
	// long, so that on a loaded machine no second waiter takes the key
	// from a taker whose renewal came late.
	g, store := faultGuard(srv.Client(t), redistest.Prefix(t), WithLease(time.Minute), WithWait(5*time.Second))
	ctx := context.Background()
	req := faultReq{Amount: 32}
	fp, err := requestFingerprint(req)
	require.NoError(t, err)
	id := opID("k")
	res, err := store.Claim(ctx, id, idemstore.ClaimRequest{Owner: "dead", Fingerprint: fp.String(), Lease: lease, TTL: time.Hour})
	require.NoError(t, err)
	require.Equal(t, idemstore.ClaimOK, res.Status)
	require.NoError(t, store.Checkpoint(ctx, id, "dead", "charge_id", []byte("ch_dead")))

	const n = 32
	var runs atomic.Int32
	errs := make(chan error, n)
	for range n {
		go func() {
			v, err := Do(ctx, g, "k", req, func(ctx context.Context, a *Attempt) (string, error) {
				runs.Add(1)
				time.Sleep(50 * time.Millisecond)
				return fmt.Sprintf("fence %d, %s", a.Fence, a.Checkpoints()["charge_id"]), nil
			})
			if err == nil && v != "fence 2, ch_dead" {
				err = fmt.Errorf("got %q", v)
			}
			errs <- err
		}()
	}
	for range n {
		require.NoError(t, <-errs)
	}
	require.Equal(t, int32(1), runs.Load())
}

// TestFaultWaitersOneSideEffect: 64 goroutines call Do on one key with
// WithWait: fn runs once, and all 64 get its result.
func TestFaultWaitersOneSideEffect(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	// A lease no renewal misses on a loaded machine: the test is about
	// duplicates, and nothing in it waits for a lease to run out.
	g, _ := faultGuard(srv.Client(t), redistest.Prefix(t), WithLease(time.Minute), WithWait(5*time.Second))
	const n = 64
	var runs atomic.Int32
	start := make(chan struct{})
	type result struct {
		v   string
		err error
	}
	results := make(chan result, n)
	for range n {
		go func() {
			<-start
			v, err := Do(context.Background(), g, "crowd", faultReq{Amount: 64}, func(ctx context.Context, a *Attempt) (string, error) {
				runs.Add(1)
				time.Sleep(150 * time.Millisecond) // a slow side effect
				return fmt.Sprintf("charged once, fence %d", a.Fence), nil
			})
			results <- result{v, err}
		}()
	}
	close(start)
	for range n {
		r := <-results
		require.NoError(t, r.err)
		require.Equal(t, "charged once, fence 1", r.v)
	}
	require.Equal(t, int32(1), runs.Load())
}

// leaseKey returns the lease key of the operation id under prefix.
func leaseKey(prefix, id string) string {
	_, l := NewRedisStore(nil, WithPrefix(prefix)).Keys(id)
	return l
}
