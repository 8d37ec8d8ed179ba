package idem_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/redistest"
)

func TestRedisStoreContractMiniredis(t *testing.T) {
	idemtest.Run(t, idemtest.Harness{
		New: func(t *testing.T) (idemstore.Store, func(time.Duration)) {
			m := miniredis.RunT(t)
			c := redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { c.Close() })
			return idem.NewRedisStore(c), m.FastForward
		},
	})
}

func TestRedisStoreContractRedisServer(t *testing.T) {
	srv := redistest.Shared(t)
	c := srv.Client(t)
	idemtest.Run(t, idemtest.Harness{
		New: func(t *testing.T) (idemstore.Store, func(time.Duration)) {
			return idem.NewRedisStore(c, idem.WithPrefix(redistest.Prefix(t))), time.Sleep
		},
		Lease: 400 * time.Millisecond, // room for a loaded machine between heartbeats
	})
}

func TestRedisStoreContractCluster(t *testing.T) {
	c := redistest.SharedCluster(t).Client(t)
	idemtest.Run(t, idemtest.Harness{
		New: func(t *testing.T) (idemstore.Store, func(time.Duration)) {
			return idem.NewRedisStore(c, idem.WithPrefix(redistest.Prefix(t))), time.Sleep
		},
		Lease: 400 * time.Millisecond, // room for a loaded machine between heartbeats
	})
}

// TestRedisStoreContractAutoPipeline runs the contract with every call
// that may ride a batch riding one, on a redis-server and on a cluster.
func TestRedisStoreContractAutoPipeline(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
	}{
		{"redis-server", func(t *testing.T) redis.UniversalClient { return redistest.Shared(t).Client(t) }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.SharedCluster(t).Client(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := tc.client(t)
			idemtest.Run(t, idemtest.Harness{
				New: func(t *testing.T) (idemstore.Store, func(time.Duration)) {
					s := idem.NewRedisStore(c, idem.WithPrefix(redistest.Prefix(t)), idem.WithAutoPipeline())
					return idem.PipelineEveryCall(s), time.Sleep
				},
				Lease: 400 * time.Millisecond,
			})
		})
	}
}

func TestRedisStoreCheck(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	log, records := recordingLogger()
	s := idem.NewRedisStore(c, idem.WithStoreLogger(log))

	require.NoError(t, c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	require.NoError(t, s.Check(ctx))
	require.Empty(t, records(), "noeviction must not warn")

	require.NoError(t, c.ConfigSet(ctx, "maxmemory-policy", "volatile-lru").Err())
	require.NoError(t, s.Check(ctx))
	require.Contains(t, records(), "maxmemory-policy noeviction", "an evicting policy must warn")
}

func TestRedisStoreCheckUnreachable(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	err := idem.NewRedisStore(c).Check(context.Background())
	require.ErrorIs(t, err, idem.ErrStoreUnavailable)
}

// TestRedisStoreScriptFlush proves that a server that lost its script cache
// (restart, failover, SCRIPT FLUSH) is served again without an error.
func TestRedisStoreScriptFlush(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t)
		ctx := context.Background()
		_, err := idem.Do(ctx, g, "k1", nil, okFn("a"))
		require.NoError(t, err)
		require.NoError(t, b.client.ScriptFlush(ctx).Err())
		v, err := idem.Do(ctx, g, "k2", nil, okFn("b"))
		require.NoError(t, err)
		require.Equal(t, "b", v)
	})
}

// TestRedisStoreReplicaAck runs claims and completions that wait for a real
// replica's acknowledgement, and shows that a missing replica fails the
// claim cleanly: fn not run, the key left free.
func TestRedisStoreReplicaAck(t *testing.T) {
	primary := redistest.Start(t, redistest.WithArgs("--repl-diskless-sync-delay", "0"))
	replica := redistest.Start(t, redistest.WithArgs("--replicaof", "127.0.0.1", strconv.Itoa(primary.Port())))
	ctx := context.Background()
	rc := replica.Client(t)
	require.Eventually(t, func() bool {
		info, err := rc.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	}, 10*time.Second, 20*time.Millisecond, "replica never synced")

	c := primary.Client(t)
	g := idem.New(idem.NewRedisStore(c, idem.WithReplicaAck(1, 2*time.Second)))
	v, err := idem.Do(ctx, g, "k", nil, okFn("acked"))
	require.NoError(t, err)
	require.Equal(t, "acked", v)
	// The replica holds the completed record as soon as Do returns.
	keys, err := rc.Keys(ctx, "idem:*").Result()
	require.NoError(t, err)
	require.Len(t, keys, 1)

	g2 := idem.New(idem.NewRedisStore(c, idem.WithReplicaAck(2, 50*time.Millisecond)), quiet)
	ran := false
	_, err = idem.Do(ctx, g2, "k2", nil, func(context.Context, *idem.Attempt) (string, error) { ran = true; return "", nil })
	require.ErrorIs(t, err, idem.ErrStoreUnavailable)
	require.ErrorContains(t, err, "1 of 2 replicas")
	require.False(t, ran)
	v, err = idem.Do(ctx, g, "k2", nil, okFn("free"))
	require.NoError(t, err, "the unacknowledged claim was released")
	require.Equal(t, "free", v)
}

// TestRedisStoreCompression stores a large, compressible result deflated and
// replays it intact; small or incompressible results are stored as they are.
func TestRedisStoreCompression(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		ctx := context.Background()
		big := []byte(strings.Repeat(`{"id":"pay_123","amount":1000,"currency":"EUR","status":"succeeded"},`, 150))
		noise := make([]byte, 4096)
		rand.Read(noise)
		tests := []struct {
			name    string
			opts    []idem.RedisOption
			payload []byte
			smaller bool
		}{
			{name: "compressible", payload: big, smaller: true},
			{name: "small", payload: []byte("tiny result")},
			{name: "compression off", opts: []idem.RedisOption{idem.WithCompression(0)}, payload: big},
			{name: "incompressible", payload: noise},
		}
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				g := idem.New(b.store(tt.opts...))
				key := fmt.Sprint("c", i)
				var id string
				_, err := idem.Do(ctx, g, key, nil, func(_ context.Context, a *idem.Attempt) ([]byte, error) {
					id = a.ID
					return tt.payload, nil
				})
				require.NoError(t, err)
				got, err := idem.Do(ctx, g, key, nil, func(context.Context, *idem.Attempt) ([]byte, error) { return nil, nil })
				require.NoError(t, err)
				require.Equal(t, tt.payload, got, "replayed intact")
				record, _ := b.store().Keys(id)
				stored, err := b.client.StrLen(ctx, record).Result()
				require.NoError(t, err)
				if tt.smaller {
					require.Less(t, stored, int64(len(tt.payload))/4, "stored deflated")
				} else {
					require.Greater(t, stored, int64(len(tt.payload)), "stored as is")
				}
			})
		}
	})
}

// TestRedisStoreRejectsMalformedOptions: a prefix with a brace would take
// over the Redis Cluster hash tag; NewRedisStore refuses it at
// construction, like the other constructors refuse malformed options.
func TestRedisStoreRejectsMalformedOptions(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { c.Close() })
	require.PanicsWithValue(t, `idem: NewRedisStore: WithPrefix("app{1}"): a prefix must not contain { or }`, func() {
		idem.NewRedisStore(c, idem.WithPrefix("app{1}"))
	})
	require.NotPanics(t, func() {
		idem.NewRedisStore(c, idem.WithPrefix(""), idem.WithReplicaAck(-1, -time.Second), idem.WithCompression(-5))
	})
}

// TestRedisStoreUnusableClients: a nil client or a go-redis Ring gets a
// clear error, never a panic, and fn does not run.
func TestRedisStoreUnusableClients(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { ring.Close() })
	tests := []struct {
		name   string
		client redis.UniversalClient
		opts   []idem.RedisOption
		want   string
	}{
		{name: "nil", client: nil, want: "needs a Redis client"},
		{name: "nil *redis.Client", client: (*redis.Client)(nil), want: "needs a Redis client"},
		{name: "Ring", client: ring, want: "Ring is not supported"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := idem.NewRedisStore(tt.client, tt.opts...)
			ran := false
			_, err := idem.Do(context.Background(), idem.New(s), "k", nil, func(context.Context, *idem.Attempt) (int, error) {
				ran = true
				return 1, nil
			})
			require.ErrorIs(t, err, idem.ErrStoreUnavailable)
			require.ErrorContains(t, err, tt.want)
			require.False(t, ran)
			require.ErrorContains(t, s.Check(context.Background()), tt.want)
		})
	}
}
