package idem_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redistest"
)

// replicated starts a primary with one replica and waits until it synced.
func replicated(t *testing.T) (primary, replica *redistest.Server) {
	t.Helper()
	primary = redistest.Start(t, redistest.WithArgs("--repl-diskless-sync-delay", "0"))
	replica = redistest.Start(t, redistest.WithArgs("--replicaof", "127.0.0.1", strconv.Itoa(primary.Port())))
	rc := replica.Client(t)
	require.Eventually(t, func() bool {
		info, err := rc.Info(context.Background(), "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	}, 10*time.Second, 20*time.Millisecond, "replica never synced")
	// Until the replica answers its first acknowledgement request, a WAIT
	// may time out although the replica is up.
	one := redis.NewClient(&redis.Options{Addr: primary.Addr(), PoolSize: 1})
	defer one.Close()
	require.Eventually(t, func() bool {
		ctx := context.Background()
		return one.Set(ctx, "warm", "1", time.Minute).Err() == nil && one.Wait(ctx, 1, 100*time.Millisecond).Val() == 1
	}, 10*time.Second, 20*time.Millisecond, "replica never acknowledged")
	return primary, replica
}

// storeModes are the store configurations a test runs under: as it is, and
// with every call that may ride a batch riding one.
var storeModes = []struct {
	name string
	opts []idem.RedisOption
}{
	{name: "plain"},
	{name: "auto-pipelined", opts: []idem.RedisOption{idem.WithAutoPipeline()}},
}

// modeStore returns a store on c with the options of a storeModes entry and
// opts; pipelined, every call that may ride a batch rides one.
func modeStore(c redis.UniversalClient, mode []idem.RedisOption, opts ...idem.RedisOption) *idem.RedisStore {
	s := idem.NewRedisStore(c, append(slices.Clone(mode), opts...)...)
	if len(mode) > 0 {
		idem.PipelineEveryCall(s)
	}
	return s
}

// fifoClient is a client that hands out its oldest idle connection first,
// with several connections warm: a WAIT sent as a command of its own would
// almost always land on another connection than the write it should cover.
func fifoClient(t *testing.T, s *redistest.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), PoolFIFO: true, MinIdleConns: 8, PoolSize: 16})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	for range 16 { // open and return several connections
		require.NoError(t, c.Ping(ctx).Err())
	}
	return c
}

// TestReplicaAckCoversItsOwnWrite: with the replica frozen, no claim may be
// reported as acknowledged. WAIT counts the writes of its own connection
// only: sent on another pooled connection, it answers at once for writes it
// never saw. (Regression test: WAIT used to be a separate command on
// whatever connection was free, and fn ran on claims no replica held.)
func TestReplicaAckCoversItsOwnWrite(t *testing.T) {
	t.Parallel()
	primary, replica := replicated(t)
	c := fifoClient(t, primary)
	ctx := context.Background()
	for _, mode := range storeModes {
		t.Run(mode.name, func(t *testing.T) {
			g := idem.New(modeStore(c, mode.opts, idem.WithPrefix(mode.name), idem.WithReplicaAck(1, 100*time.Millisecond)), quiet)
			_, err := idem.Do(ctx, g, "warm", nil, okFn("ok")) // loads the scripts
			require.NoError(t, err)

			replica.Pause(t)
			defer replica.Resume(t)
			var runs atomic.Int32
			for i := range 8 {
				_, err := idem.Do(ctx, g, fmt.Sprint("k", i), nil, func(context.Context, *idem.Attempt) (string, error) {
					runs.Add(1)
					return "v", nil
				})
				require.ErrorIs(t, err, idem.ErrStoreUnavailable, "key %d", i)
				require.ErrorContains(t, err, "0 of 1 replicas")
			}
			require.Zero(t, runs.Load(), "fn ran on a claim that no replica acknowledged")
		})
	}
}

// TestReplicaAckReplays: a completed record that no replica holds is not
// handed out as a replay; once the replica has it, the replay is. (Regression
// test: a replay used to be returned at once, and a failover right after
// lost a result the caller had been given.)
func TestReplicaAckReplays(t *testing.T) {
	t.Parallel()
	primary, replica := replicated(t)
	ctx := context.Background()
	for _, mode := range storeModes {
		t.Run(mode.name, func(t *testing.T) {
			plain := idem.New(idem.NewRedisStore(primary.Client(t), idem.WithPrefix(mode.name)), quiet)
			acked := idem.New(modeStore(fifoClient(t, primary), mode.opts, idem.WithPrefix(mode.name),
				idem.WithReplicaAck(1, 100*time.Millisecond)), quiet)
			_, err := idem.Do(ctx, acked, "warm", nil, okFn("ok"))
			require.NoError(t, err)

			replica.Pause(t)
			v, err := idem.Do(ctx, plain, "k", nil, okFn("first")) // completed on the primary only
			require.NoError(t, err)
			require.Equal(t, "first", v)
			for range 4 {
				_, err = idem.Do(ctx, acked, "k", nil, okFn("second"))
				require.ErrorIs(t, err, idem.ErrStoreUnavailable, "a replay no replica holds")
			}

			replica.Resume(t)
			require.Eventually(t, func() bool {
				v, err = idem.Do(ctx, acked, "k", nil, okFn("second"))
				return err == nil
			}, 5*time.Second, 20*time.Millisecond)
			require.Equal(t, "first", v)
		})
	}
}

// TestReplicaAckRenewals: with the replica frozen while fn runs, renewals
// are not acknowledged and do not count: fn's context is cancelled with
// ErrLeaseLost by the end of the lease, since a failover would bring back
// the lease as it was before the renewals.
func TestReplicaAckRenewals(t *testing.T) {
	t.Parallel()
	primary, replica := replicated(t)
	const lease = 300 * time.Millisecond
	for _, mode := range storeModes {
		t.Run(mode.name, func(t *testing.T) {
			g := idem.New(modeStore(primary.Client(t), mode.opts, idem.WithPrefix(mode.name),
				idem.WithReplicaAck(1, 50*time.Millisecond)), quiet, idem.WithLease(lease))
			start := time.Now()
			told := false
			_, err := idem.Do(context.Background(), g, "k", nil, func(ctx context.Context, a *idem.Attempt) (string, error) {
				replica.Pause(t)
				defer replica.Resume(t)
				select {
				case <-ctx.Done():
					told = true
					return "", context.Cause(ctx)
				case <-time.After(time.Minute):
					return "ran on", nil
				}
			})
			require.ErrorIs(t, err, idem.ErrLeaseLost)
			require.True(t, told, "fn's context was cancelled")
			require.Less(t, time.Since(start), 10*lease, "by the end of the lease (a bound generous enough for any load)")
		})
	}
}

// waitCounter counts WAIT commands, alone or in a pipeline.
type waitCounter struct{ n atomic.Int32 }

func (h *waitCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *waitCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "wait" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *waitCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if cmd.Name() == "wait" {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// TestReplicaAckReleaseDoesNotWait: a release is never waited for (a
// release a failover forgets only keeps the key claimed until its lease
// runs out), so with WithReplicaAck it sends no WAIT and does not pay the
// replicas' delay; here, on a server without replicas, a WAIT would block
// for the whole ack timeout.
func TestReplicaAckReleaseDoesNotWait(t *testing.T) {
	c := redistest.Shared(t).Client(t)
	h := &waitCounter{}
	c.AddHook(h)
	for _, mode := range storeModes {
		st := modeStore(c, mode.opts, idem.WithPrefix(redistest.Prefix(t)), idem.WithReplicaAck(1, time.Minute))
		start := time.Now()
		err := st.Release(context.Background(), "no-such-operation", "owner")
		require.ErrorIs(t, err, idem.ErrLeaseLost, mode.name) // nothing to release
		require.Zero(t, h.n.Load(), "release sent WAIT (%s)", mode.name)
		require.Less(t, time.Since(start), 10*time.Second, "%s: a WAIT would block for the minute of the ack timeout", mode.name)
	}
}

// TestReplicaAckScriptFlush: a claim that waits for a replica on a server
// that lost its scripts (restart, failover, SCRIPT FLUSH) is sent again with
// EVAL, in its own pipeline with its WAIT, and succeeds.
func TestReplicaAckScriptFlush(t *testing.T) {
	primary, _ := replicated(t)
	c := primary.Client(t)
	ctx := context.Background()
	g := idem.New(idem.NewRedisStore(c, idem.WithReplicaAck(1, 5*time.Second)), quiet)
	_, err := idem.Do(ctx, g, "k1", nil, okFn("a"))
	require.NoError(t, err)
	require.NoError(t, c.ScriptFlush(ctx).Err())
	v, err := idem.Do(ctx, g, "k2", nil, okFn("b"))
	require.NoError(t, err)
	require.Equal(t, "b", v)
}
