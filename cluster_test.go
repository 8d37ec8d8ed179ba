//go:build unix

package idem

// Tests on a real three-master Redis Cluster (internal/redistest), with keys
// spread over many slots: every script must touch one slot, so all keys of
// one operation share a hash tag.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/redistest"
)

// clusterBackend is the shared cluster, a client and a key prefix of one
// test, and whether the test's stores auto-pipeline every call.
type clusterBackend struct {
	cluster   *redistest.Cluster
	client    *redis.ClusterClient
	prefix    string
	pipelined bool
}

func newClusterBackend(t *testing.T) *clusterBackend {
	t.Helper()
	cl := redistest.SharedCluster(t)
	return &clusterBackend{cluster: cl, client: cl.Client(t), prefix: redistest.Prefix(t)}
}

// forEachClusterMode runs f, in parallel subtests, on a backend whose
// stores send every call directly (WithoutAutoPipeline) and on one whose
// stores batch every call that may be batched.
func forEachClusterMode(t *testing.T, f func(t *testing.T, b *clusterBackend)) {
	t.Helper()
	for _, pipelined := range []bool{false, true} {
		name := "plain"
		if pipelined {
			name = "auto-pipelined"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := newClusterBackend(t)
			b.pipelined = pipelined
			f(t, b)
		})
	}
}

// store returns a store on c (the backend's client when nil) with the
// backend's mode and opts.
func (b *clusterBackend) store(c redis.UniversalClient, opts ...RedisOption) *RedisStore {
	if c == nil {
		c = b.client
	}
	opts = append([]RedisOption{WithPrefix(b.prefix)}, opts...)
	if !b.pipelined {
		return NewRedisStore(c, append(opts, WithoutAutoPipeline())...)
	}
	return PipelineEveryCall(NewRedisStore(c, append(opts, WithAutoPipeline())...))
}

func (b *clusterBackend) guard(opts ...Option) (*Guard, *RedisStore) {
	s := b.store(nil)
	return New(s, append([]Option{quietLog}, opts...)...), s
}

func (b *clusterBackend) recordKey(id string) string {
	r, _ := NewRedisStore(nil, WithPrefix(b.prefix)).Keys(id)
	return r
}
func (b *clusterBackend) leaseKey(id string) string { return b.recordKey(id) + ":l" }

// masterOfSlot maps every slot to the address of its master.
func (b *clusterBackend) masterOfSlot(t *testing.T) map[int]string {
	t.Helper()
	shards, err := b.client.ClusterShards(context.Background()).Result()
	require.NoError(t, err)
	m := make(map[int]string)
	for _, s := range shards {
		var master string
		for _, n := range s.Nodes {
			if n.Role == "master" {
				master = net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
			}
		}
		for _, r := range s.Slots {
			for slot := r.Start; slot <= r.End; slot++ {
				m[int(slot)] = master
			}
		}
	}
	require.Len(t, m, 16384)
	return m
}

// TestClusterDo runs Do on many keys across the cluster and checks, on the
// server, that an operation's record and lease share a slot and carry the
// TTLs the spec gives them, and that the keys reach every master.
func TestClusterDo(t *testing.T) {
	t.Parallel()
	b := newClusterBackend(t)
	const lease, retention = 2 * time.Second, time.Hour
	g, store := b.guard(WithLease(lease), WithRetention(retention))
	ctx := context.Background()
	masters := b.masterOfSlot(t)
	slots := map[int]bool{}
	usedMasters := map[string]int{}

	const keys = 120
	for i := range keys {
		key := fmt.Sprintf("order-%d", i)
		v, err := Do(ctx, g, key, faultReq{Amount: i}, func(ctx context.Context, a *Attempt) (string, error) {
			require.Equal(t, int64(1), a.Fence)
			rec, lk := b.recordKey(a.ID), b.leaseKey(a.ID)
			slot := b.cluster.KeySlot(t, rec)
			require.Equal(t, slot, b.cluster.KeySlot(t, lk), "record and lease of %q share a slot", key)
			slots[slot] = true
			usedMasters[masters[slot]]++

			recTTL, err := b.client.PTTL(ctx, rec).Result()
			require.NoError(t, err)
			require.Greater(t, recTTL, retention, "an unfinished record lives lease + retention")
			require.LessOrEqual(t, recTTL, lease+retention)
			leaseTTL, err := b.client.PTTL(ctx, lk).Result()
			require.NoError(t, err)
			require.Greater(t, leaseTTL, time.Duration(0))
			require.LessOrEqual(t, leaseTTL, lease)
			require.NoError(t, a.Checkpoint(ctx, "n", fmt.Append(nil, i)))
			return fmt.Sprintf("v%d", i), nil
		})
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("v%d", i), v)

		id := opID(key)
		recTTL, err := b.client.PTTL(ctx, b.recordKey(id)).Result()
		require.NoError(t, err)
		require.Greater(t, recTTL, retention-time.Minute, "a completed record lives retention")
		require.LessOrEqual(t, recTTL, retention)
		require.ErrorIs(t, b.client.Get(ctx, b.leaseKey(id)).Err(), redis.Nil, "completion drops the lease")
		rec, err := store.Read(ctx, id)
		require.NoError(t, err)
		require.Equal(t, idemstore.StateCompleted, rec.State)
	}
	require.Greater(t, len(slots), keys*3/4, "keys spread over many slots")
	require.Len(t, usedMasters, 3, "keys reach every master: %v", usedMasters)

	for i := range keys {
		v, err := Do(ctx, g, fmt.Sprintf("order-%d", i), faultReq{Amount: i}, func(context.Context, *Attempt) (string, error) {
			t.Error("a completed key ran again")
			return "", nil
		})
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("v%d", i), v)
	}
	_, err := Do(ctx, g, "order-0", faultReq{Amount: -1}, func(context.Context, *Attempt) (string, error) {
		t.Error("a mismatched request ran")
		return "", nil
	})
	require.ErrorIs(t, err, ErrMismatch)
}

// TestClusterOnce checks message deduplication across the cluster: an id
// runs once, an error releases it, and Once ids do not meet Do keys.
func TestClusterOnce(t *testing.T) {
	t.Parallel()
	b := newClusterBackend(t)
	g, _ := b.guard(WithLease(time.Second))
	ctx := context.Background()

	for i := range 60 {
		id := fmt.Sprintf("msg-%d", i)
		runs := 0
		fn := func(context.Context) error { runs++; return nil }
		if i%3 == 0 { // the first delivery fails: the redelivery runs again
			ran, err := g.Once(ctx, id, func(context.Context) error { runs++; return errors.New("broker hiccup") })
			require.True(t, ran)
			require.EqualError(t, err, "broker hiccup")
		}
		ran, err := g.Once(ctx, id, fn)
		require.NoError(t, err)
		require.True(t, ran)
		ran, err = g.Once(ctx, id, fn)
		require.NoError(t, err)
		require.False(t, ran, "a redelivery of %s ran", id)
		require.Equal(t, 1+btoi(i%3 == 0), runs)

		// The same string as a Do key is another operation.
		v, err := Do(ctx, g, id, nil, func(context.Context, *Attempt) (string, error) { return "do", nil })
		require.NoError(t, err)
		require.Equal(t, "do", v)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestClusterConcurrentDuplicates: 32 goroutines per key, on 8 keys at once,
// with WithWait: each key's side effect happens once and every caller gets
// its result.
func TestClusterConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	forEachClusterMode(t, testClusterConcurrentDuplicates)
}

func testClusterConcurrentDuplicates(t *testing.T, b *clusterBackend) {
	// The lease is long enough that no claim of the 256 callers is answered
	// past its end on a loaded machine (that claim would be refused as late,
	// rightly, and this test is about duplicates, not late answers).
	g, _ := b.guard(WithLease(10*time.Second), WithWait(30*time.Second))
	const keys, callers = 8, 32
	var effects [keys]atomic.Int32
	errs := make(chan error, keys*callers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for k := range keys {
		for range callers {
			wg.Go(func() {
				<-start
				key := fmt.Sprintf("pay-%d", k)
				v, err := Do(context.Background(), g, key, faultReq{Amount: k}, func(ctx context.Context, a *Attempt) (string, error) {
					effects[k].Add(1)
					time.Sleep(100 * time.Millisecond)
					return fmt.Sprintf("charged %d", k), nil
				})
				if err == nil && v != fmt.Sprintf("charged %d", k) {
					err = fmt.Errorf("key %s: got %q", key, v)
				}
				errs <- err
			})
		}
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for k := range keys {
		require.Equal(t, int32(1), effects[k].Load(), "side effects of key %d", k)
	}
}

// TestClusterTakeover: claims left by a crashed holder on keys across the
// cluster block retries until their leases expire; then the retries take
// over with Fence 2 and the dead holder's checkpoints.
func TestClusterTakeover(t *testing.T) {
	t.Parallel()
	forEachClusterMode(t, testClusterTakeover)
}

func testClusterTakeover(t *testing.T, b *clusterBackend) {
	const lease = time.Second // room for a claim, a checkpoint and a retry on a loaded machine
	g, store := b.guard(WithLease(lease))
	ctx := context.Background()
	fp, err := requestFingerprint(faultReq{Amount: 9})
	require.NoError(t, err)

	const keys = 24
	for i := range keys {
		id := opID(fmt.Sprintf("job-%d", i))
		res, err := store.Claim(ctx, id, idemstore.ClaimRequest{Owner: "dead", Fingerprint: fp.String(), Lease: lease, TTL: lease + time.Hour})
		require.NoError(t, err)
		require.Equal(t, idemstore.ClaimOK, res.Status)
		require.NoError(t, store.Checkpoint(ctx, id, "dead", "step", fmt.Append(nil, i)))

		_, err = Do(ctx, g, fmt.Sprintf("job-%d", i), faultReq{Amount: 9}, func(context.Context, *Attempt) (string, error) {
			t.Error("ran while the lease was live")
			return "", nil
		})
		var busy *InProgressError
		require.ErrorAs(t, err, &busy)
		require.ErrorIs(t, err, ErrInProgress)
		require.Greater(t, busy.RetryAfter, time.Duration(0))
	}
	claimed := time.Now() // after every claim: every lease ends by claimed+lease

	time.Sleep(time.Until(claimed.Add(lease + 20*time.Millisecond))) // the leases run out on the server
	for i := range keys {
		v, err := Do(ctx, g, fmt.Sprintf("job-%d", i), faultReq{Amount: 9}, func(ctx context.Context, a *Attempt) (string, error) {
			require.Equal(t, int64(2), a.Fence)
			require.Equal(t, fmt.Append(nil, i), a.Checkpoints()["step"])
			return fmt.Sprintf("resumed %d", i), nil
		})
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("resumed %d", i), v)
	}
	// The dead holder cannot complete over the new owner's result.
	require.ErrorIs(t, store.Complete(ctx, opID("job-0"), "dead", []byte("vzombie"), time.Hour), ErrLeaseLost)
	v, err := Do(ctx, g, "job-0", faultReq{Amount: 9}, func(context.Context, *Attempt) (string, error) { return "", nil })
	require.NoError(t, err)
	require.Equal(t, "resumed 0", v)
}

// TestClusterDroppedReply: the cluster client re-sends a claim or complete
// whose reply was lost; fn runs once and the result is stored.
func TestClusterDroppedReply(t *testing.T) {
	t.Parallel()
	for _, script := range []struct{ name, src string }{{"claim", claimLua}, {"complete", completeLua}} {
		t.Run(script.name, func(t *testing.T) {
			forEachClusterMode(t, func(t *testing.T, b *clusterBackend) {
				testClusterDroppedReply(t, b, script.src)
			})
		})
	}
}

func testClusterDroppedReply(t *testing.T, b *clusterBackend, src string) {
	d := redistest.NewReplyDropper(redistest.MatchScript(src), 0)
	opts := b.cluster.Options()
	opts.Dialer = d.Dial
	c := redis.NewClusterClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	g := New(b.store(c), quietLog, WithLease(time.Second))
	ctx := context.Background()
	// A re-sent claim that answers after its lease, measured from when it
	// was sent (a loaded machine), is refused by the library, as it must
	// be: that try proves nothing, and the next one runs on a fresh key.
	const tries = 10
	for try := 1; ; try++ {
		require.LessOrEqual(t, try, tries, "in each of %d tries the library found the claim's reply later than its lease", tries)
		key := fmt.Sprintf("k%d", try)
		dropped := d.Dropped()
		d.Arm(1)
		runs := 0
		v, err := Do(ctx, g, key, faultReq{}, func(ctx context.Context, a *Attempt) (string, error) {
			runs++
			return fmt.Sprintf("fence %d", a.Fence), nil
		})
		d.Arm(0)
		if refusedLate(err) {
			require.Zero(t, runs, "fn ran on a claim the library refused")
			continue
		}
		require.NoError(t, err)
		require.Equal(t, "fence 1", v)
		v, err = Do(ctx, g, key, faultReq{}, func(ctx context.Context, a *Attempt) (string, error) {
			runs++
			return fmt.Sprintf("fence %d", a.Fence), nil
		})
		require.NoError(t, err)
		require.Equal(t, "fence 1", v)
		require.Equal(t, 1, runs)
		require.Equal(t, dropped+1, d.Dropped())
		return
	}
}

// TestClusterReplicaAck: with replica acks, each script and its WAIT go to
// the master of the operation's slot on one connection. This cluster has no
// replicas, so every claim is refused as unacknowledged (never misrouted:
// a script sent to another node would fail with MOVED) and released.
func TestClusterReplicaAck(t *testing.T) {
	t.Parallel()
	forEachClusterMode(t, testClusterReplicaAck)
}

func testClusterReplicaAck(t *testing.T, b *clusterBackend) {
	s := b.store(nil, WithReplicaAck(1, 20*time.Millisecond))
	g := New(s, quietLog)
	ctx := context.Background()
	slots := map[int]bool{}
	for i := range 24 {
		key := fmt.Sprint("ack-", i)
		_, err := Do(ctx, g, key, nil, func(context.Context, *Attempt) (string, error) {
			t.Error("fn ran on an unacknowledged claim")
			return "", nil
		})
		require.ErrorIs(t, err, ErrStoreUnavailable)
		require.ErrorContains(t, err, "0 of 1 replicas")
		id := opID(key)
		slots[b.cluster.KeySlot(t, b.recordKey(id))] = true
		require.Zero(t, b.client.Exists(ctx, b.leaseKey(id)).Val(), "the claim was released")
		require.Equal(t, int64(1), b.client.Exists(ctx, b.recordKey(id)).Val())
	}
	require.Greater(t, len(slots), 12)
}
