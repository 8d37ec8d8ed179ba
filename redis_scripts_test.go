package idem

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/redistest"
)

// The paths of lua/*.lua that the store contract (idemtest) does not reach:
// a write to a record that is gone, a replaced checkpoint as stored, the
// key an error names, and the write a replay makes for WAIT. TestLuaMutants
// runs them against every mutant of the scripts.

// TestCheckpointScriptPaths: a checkpoint on a record that is gone is a lost
// lease, and writes nothing; a replaced checkpoint is stored once, in place
// of its earlier value.
func TestCheckpointScriptPaths(t *testing.T) {
	forEachRawBackend(t, func(t *testing.T, b rawBackend) {
		ctx := context.Background()
		s := NewRedisStore(b.c, WithPrefix(b.prefix))
		rec, _ := s.Keys("cp")

		require.ErrorIs(t, s.Checkpoint(ctx, "cp", "own1", "a", []byte("1")), ErrLeaseLost)
		require.Zero(t, b.c.Exists(ctx, rec).Val(), "no record written for a checkpoint without one")

		res, err := s.Claim(ctx, "cp", idemstore.ClaimRequest{Owner: "own1", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		require.NoError(t, err)
		require.Equal(t, idemstore.ClaimOK, res.Status)
		f, err := splitRecord(b.c.Get(ctx, rec).Val())
		require.NoError(t, err)
		for _, cp := range []struct{ name, value string }{
			{"a:", "1"}, {"b", "22"}, {"a:", "333"}, {"b", "4444444444"}, {"a:", ""},
		} {
			require.NoError(t, s.Checkpoint(ctx, "cp", "own1", cp.name, []byte(cp.value)))
		}
		require.Equal(t, "1P|1|own1|fp|"+f.created+"|1:b10:44444444442:a:0:", b.c.Get(ctx, rec).Val(),
			"each name once, with its last value, the replaced one last")
	})
}

// TestScriptErrorsNameTheRecord: a record that cannot be read is reported
// with the key of the record, not the key of its lease.
func TestScriptErrorsNameTheRecord(t *testing.T) {
	forEachRawBackend(t, func(t *testing.T, b rawBackend) {
		ctx := context.Background()
		s := NewRedisStore(b.c, WithPrefix(b.prefix))
		rec, lease := s.Keys("bad")
		req := idemstore.ClaimRequest{Owner: "own1", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
		for _, tc := range []struct {
			name, record, err string
		}{
			{"unknown format", "2P|1|own1|fp|1|", "record of an unknown format at " + rec},
			{"unreadable header", "1P|x|own1|fp|1|", "unreadable record at " + rec},
		} {
			t.Run(tc.name, func(t *testing.T) {
				require.NoError(t, b.c.Set(ctx, rec, tc.record, time.Hour).Err())
				_, err := s.Claim(ctx, "bad", req)
				require.ErrorContains(t, err, tc.err)
				require.NotContains(t, err.Error(), lease)
			})
		}
		require.NoError(t, b.c.Set(ctx, rec, "2P|1|own1|fp|1|", time.Hour).Err())
		for what, err := range map[string]error{
			"checkpoint": s.Checkpoint(ctx, "bad", "own1", "n", nil),
			"complete":   s.Complete(ctx, "bad", "own1", nil, time.Hour),
			"release":    s.Release(ctx, "bad", "own1"),
		} {
			require.ErrorContains(t, err, "record of an unknown format at "+rec, what)
			require.NotContains(t, err.Error(), lease, what)
		}
	})
}

// TestClaimScriptTouchesReplays: with replica acks, a replay rewrites the
// completed record's own TTL, a write that the WAIT behind the script
// covers; without them a replay writes nothing. Seen by the server's
// keyspace events, in order, on a redis-server of its own.
func TestClaimScriptTouchesReplays(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	require.NoError(t, c.ConfigSet(ctx, "notify-keyspace-events", "Kg$").Err())
	plain := NewRedisStore(c)
	acked := NewRedisStore(c, WithReplicaAck(1, 10*time.Millisecond)) // no replica: WAIT times out
	rec, _ := plain.Keys("replay")
	events := c.PSubscribe(ctx, "__keyspace@0__:"+rec)
	t.Cleanup(func() { _ = events.Close() })
	_, err := events.Receive(ctx)
	require.NoError(t, err)
	require.NoError(t, c.Set(ctx, rec, "1C|3|own1|fp|1700000000|=done", time.Hour).Err())
	next := func() string {
		t.Helper()
		select {
		case m := <-events.Channel():
			return m.Payload
		case <-time.After(10 * time.Second): // an event on the same server: far beyond what it takes
			t.Fatal("no keyspace event")
			return ""
		}
	}
	require.Equal(t, []string{"set", "expire"}, []string{next(), next()})

	req := idemstore.ClaimRequest{Owner: "own2", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	res, err := plain.Claim(ctx, "replay", req)
	require.NoError(t, err)
	require.Equal(t, idemstore.ClaimCompleted, res.Status)
	require.NoError(t, c.SetArgs(ctx, rec, "1C|3|own1|fp|1700000000|=done", redis.SetArgs{KeepTTL: true}).Err())
	require.Equal(t, "set", next(), "the plain replay wrote nothing")
	_, err = acked.Claim(ctx, "replay", req)
	require.ErrorContains(t, err, "0 of 1 replicas", "the replay is not handed out")
	require.Equal(t, "expire", next(), "the acked replay's touch")
	ttl := c.PTTL(ctx, rec).Val()
	require.Greater(t, ttl, 59*time.Minute, "the touch keeps the record's TTL")
	require.LessOrEqual(t, ttl, time.Hour)
}

// TestClaimScriptLeasePaths: what a claim does with the lease key beside
// an unfinished record. A claim re-sent by the record's owner renews a
// lapsed lease, but is told to wait while another token holds it; a lease
// without a TTL (set by hand) makes a claimant wait one lease; a takeover
// holds the lease for the new owner, for one lease.
func TestClaimScriptLeasePaths(t *testing.T) {
	forEachRawBackend(t, func(t *testing.T, b rawBackend) {
		ctx := context.Background()
		s := NewRedisStore(b.c, WithPrefix(b.prefix))
		rec, lease := s.Keys("lp")
		claim := func(owner string) idemstore.ClaimResult {
			t.Helper()
			res, err := s.Claim(ctx, "lp", idemstore.ClaimRequest{Owner: owner, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
			require.NoError(t, err)
			return res
		}
		holds := func(owner string) {
			t.Helper()
			require.Equal(t, owner, b.c.Get(ctx, lease).Val(), "the lease's holder")
			ttl := b.c.PTTL(ctx, lease).Val()
			require.Greater(t, ttl, 50*time.Second, "the lease runs one lease (a minute)")
			require.LessOrEqual(t, ttl, time.Minute)
		}
		require.Equal(t, idemstore.ClaimOK, claim("own1").Status)

		// Re-sent after the lease lapsed: the owner holds it again.
		require.NoError(t, b.c.Del(ctx, lease).Err())
		res := claim("own1")
		require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimOK, Fence: 1, Checkpoints: res.Checkpoints}, res)
		holds("own1")

		// Re-sent while another token holds the lease: wait for it.
		require.NoError(t, b.c.Set(ctx, lease, "own2", 30*time.Second).Err())
		res = claim("own1")
		require.Equal(t, idemstore.ClaimBusy, res.Status)
		require.Greater(t, res.RetryAfter, 20*time.Second, "the other holder's PTTL")
		require.LessOrEqual(t, res.RetryAfter, 30*time.Second)
		require.Equal(t, "own2", b.c.Get(ctx, lease).Val())

		// A lease without a TTL: wait one lease.
		require.NoError(t, b.c.Set(ctx, lease, "own2", 0).Err())
		res = claim("own3")
		require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimBusy, RetryAfter: time.Minute}, res)

		// A takeover: the new owner holds the lease.
		require.NoError(t, b.c.Del(ctx, lease).Err())
		res = claim("own3")
		require.Equal(t, idemstore.ClaimOK, res.Status)
		require.Equal(t, int64(2), res.Fence)
		holds("own3")
		require.Equal(t, idemstore.ClaimBusy, claim("own4").Status)
		require.Contains(t, b.c.Get(ctx, rec).Val(), "|own3|")
	})
}

// TestClaimScriptLastMillisecond: a lease with a millisecond left is still
// held; a claimant waits that millisecond.
func TestClaimScriptLastMillisecond(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	s := NewRedisStore(c)
	req := idemstore.ClaimRequest{Owner: "own1", Fingerprint: "fp", Lease: time.Second, TTL: time.Hour}
	res, err := s.Claim(ctx, "ms", req)
	require.NoError(t, err)
	require.Equal(t, idemstore.ClaimOK, res.Status)
	m.FastForward(999 * time.Millisecond)
	req.Owner = "own2"
	res, err = s.Claim(ctx, "ms", req)
	require.NoError(t, err)
	require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimBusy, RetryAfter: time.Millisecond}, res)
}

// TestCompleteScriptPaths: a completion of a record that is gone is a lost
// lease and writes nothing; a completion re-sent by its owner succeeds
// without writing the record again.
func TestCompleteScriptPaths(t *testing.T) {
	forEachRawBackend(t, func(t *testing.T, b rawBackend) {
		ctx := context.Background()
		s := NewRedisStore(b.c, WithPrefix(b.prefix), WithCompression(0))
		rec, _ := s.Keys("cs")
		require.ErrorIs(t, s.Complete(ctx, "cs", "own1", []byte("r"), time.Hour), ErrLeaseLost)
		require.Zero(t, b.c.Exists(ctx, rec).Val())

		res, err := s.Claim(ctx, "cs", idemstore.ClaimRequest{Owner: "own1", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		require.NoError(t, err)
		require.Equal(t, idemstore.ClaimOK, res.Status)
		require.NoError(t, s.Complete(ctx, "cs", "own1", []byte("first"), time.Hour))
		require.NoError(t, s.Complete(ctx, "cs", "own1", []byte("again"), 2*time.Hour), "a re-sent completion")
		require.True(t, strings.HasSuffix(b.c.Get(ctx, rec).Val(), "|=first"), "the record as first completed")
		require.LessOrEqual(t, b.c.PTTL(ctx, rec).Val(), time.Hour, "its retention as first completed")
	})
}

// TestScriptsPublish: a completion, a release and a forget each publish on
// the record's channel, which waiters subscribe to; a re-sent completion and
// a forget that deletes nothing publish nothing, and report no refused
// publish.
func TestScriptsPublish(t *testing.T) {
	c := redistest.Shared(t).Client(t)
	ctx := context.Background()
	var logged strings.Builder
	s := NewRedisStore(c, WithPrefix(redistest.Prefix(t)), WithStoreLogger(slog.New(slog.NewTextHandler(&logged, nil))))
	rec, _ := s.Keys("pub")
	sub := c.SSubscribe(ctx, rec+":n")
	t.Cleanup(func() { _ = sub.Close() })
	_, err := sub.Receive(ctx)
	require.NoError(t, err)
	// next is what the subscription receives next: a message, or the pong
	// of a PING sent after everything before it.
	next := func() any {
		t.Helper()
		m, err := sub.ReceiveTimeout(ctx, 10*time.Second) // far beyond what a local server takes
		require.NoError(t, err)
		return m
	}
	published := func(what string) {
		t.Helper()
		m, ok := next().(*redis.Message)
		require.True(t, ok, "%s published nothing", what)
		require.Equal(t, rec+":n", m.Channel, what)
	}
	quiet := func(what string) {
		t.Helper()
		require.NoError(t, sub.Ping(ctx))
		require.IsType(t, &redis.Pong{}, next(), "%s published", what)
	}
	claim := func() {
		t.Helper()
		res, err := s.Claim(ctx, "pub", idemstore.ClaimRequest{Owner: "own1", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		require.NoError(t, err)
		require.Equal(t, idemstore.ClaimOK, res.Status)
	}
	forgot, err := s.Forget(ctx, "pub", false)
	require.NoError(t, err)
	require.False(t, forgot)
	quiet("a forget of nothing")
	claim()
	require.NoError(t, s.Release(ctx, "pub", "own1"))
	published("a release")
	claim()
	require.NoError(t, s.Complete(ctx, "pub", "own1", []byte("r"), time.Hour))
	published("a completion")
	require.NoError(t, s.Complete(ctx, "pub", "own1", []byte("r"), time.Hour))
	quiet("a re-sent completion")
	forgot, err = s.Forget(ctx, "pub", false)
	require.NoError(t, err)
	require.True(t, forgot)
	published("a forget of the record alone")
	require.Empty(t, logged.String(), "no publish was refused")
}

// TestCompleteScriptPublishRefused: a user that may not publish releases and
// completes all the same, and the store says that waiters will poll.
func TestCompleteScriptPublishRefused(t *testing.T) {
	srv := redistest.Shared(t)
	ctx := context.Background()
	user := strings.ReplaceAll(t.Name(), "/", "-")
	require.NoError(t, srv.Client(t).Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "~*", "resetchannels", "+@all").Err())
	o := srv.Options()
	o.Username, o.Password = user, "pw"
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	req := idemstore.ClaimRequest{Owner: "own1", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	prefix := redistest.Prefix(t)
	for _, write := range []func(s *RedisStore) error{
		func(s *RedisStore) error { return s.Release(ctx, "nopub", "own1") },
		func(s *RedisStore) error { return s.Complete(ctx, "nopub", "own1", []byte("r"), time.Hour) },
	} {
		var logged strings.Builder
		s := NewRedisStore(c, WithPrefix(prefix), WithStoreLogger(slog.New(slog.NewTextHandler(&logged, nil))))
		res, err := s.Claim(ctx, "nopub", req)
		require.NoError(t, err)
		require.Equal(t, idemstore.ClaimOK, res.Status)
		require.NoError(t, write(s))
		require.Contains(t, logged.String(), "may not use the sharded channels")
	}
	r, err := NewRedisStore(c, WithPrefix(prefix)).Read(ctx, "nopub")
	require.NoError(t, err)
	require.Equal(t, idemstore.StateCompleted, r.State)
}
