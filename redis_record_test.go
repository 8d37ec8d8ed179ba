package idem

import (
	"bytes"
	"compress/flate"
	"context"
	"crypto/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/redistest"
)

// FuzzDecodeRecord checks that any stored bytes decode to a record or an
// error, never a panic, and that checkpoints round-trip.
func FuzzDecodeRecord(f *testing.F) {
	for _, s := range []string{
		"1P|1|owner|fp|1764000000|", "1P|2|o|f|0|1:a1:b", "1C|3|o|f|1|=v{\"x\":1}", "1C|1|o|f|1|=", "1C|1|o|f|1|z\x01\x00",
		"1C|1|o|f|1|zgarbage", "1P|x|o|f|1|", "1Q|1|o|f|1|", "2P|1|o|f|1|", "1P|1|o|f|-5|", "1P|1|o|f||",
		"1P|1|o|f|1|9:a", "1P|1|o|f|1|-1:", "1P|1|o|f|1|1:a", "", "|||||", "P|1|o|f|",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		r, err := decodeRecord(v)
		if err != nil {
			return
		}
		if r.State != idemstore.StateInProgress && r.State != idemstore.StateCompleted {
			t.Fatalf("decoded state %v", r.State)
		}
		if r.State == idemstore.StateInProgress {
			enc := encodeCheckpoints(r.Checkpoints)
			back, err := decodeCheckpoints(enc)
			if err != nil || len(back) != len(r.Checkpoints) {
				t.Fatalf("checkpoints do not round-trip: %q -> %q (%v)", v, enc, err)
			}
		}
	})
}

// encodeCheckpoints encodes checkpoints as lua/checkpoint.lua does.
func encodeCheckpoints(m map[string][]byte) string {
	var b strings.Builder
	for k, v := range m {
		b.WriteString(strconv.Itoa(len(k)) + ":" + k + strconv.Itoa(len(v)) + ":" + string(v))
	}
	return b.String()
}

// TestScriptsAgreeOnLayout runs every script against a real store and reads
// the raw record after each step: every script writes the documented format
// 1 layout, keeps the header fields it must keep, and refuses a record of an
// unknown format instead of misreading it.
func TestScriptsAgreeOnLayout(t *testing.T) {
	forEachRawBackend(t, func(t *testing.T, b rawBackend) {
		{
			ctx := context.Background()
			s := NewRedisStore(b.c, WithPrefix(b.prefix), WithCompression(0))
			rec, lease := s.Keys("id1")
			raw := func() string { return b.c.Get(ctx, rec).Val() }
			before := time.Now().Unix()
			res, err := s.Claim(ctx, "id1", idemstore.ClaimRequest{Owner: "own1", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
			require.NoError(t, err)
			require.Equal(t, idemstore.ClaimOK, res.Status)
			f, err := splitRecord(raw())
			require.NoError(t, err)
			created, err := strconv.ParseInt(f.created, 10, 64)
			require.NoError(t, err)
			require.InDelta(t, before, created, 2)
			require.Equal(t, recordFields{state: "P", fence: "1", owner: "own1", fp: "fp", created: f.created}, f)

			require.NoError(t, s.Checkpoint(ctx, "id1", "own1", "charge", []byte("ch|1")))
			require.Equal(t, "1P|1|own1|fp|"+f.created+"|6:charge4:ch|1", raw())

			require.NoError(t, s.Release(ctx, "id1", "own1"))
			require.Equal(t, "1P|1|own1|fp|"+f.created+"|6:charge4:ch|1", raw(), "release keeps the record")
			require.Zero(t, b.c.Exists(ctx, lease).Val())

			res, err = s.Claim(ctx, "id1", idemstore.ClaimRequest{Owner: "own2", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
			require.NoError(t, err)
			require.Equal(t, int64(2), res.Fence)
			require.Equal(t, "1P|2|own2|fp|"+f.created+"|6:charge4:ch|1", raw(), "a takeover keeps the creation time and checkpoints")

			require.NoError(t, s.Complete(ctx, "id1", "own2", []byte("result"), time.Hour))
			require.Equal(t, "1C|2|own2|fp|"+f.created+"|=result", raw())
			r, err := s.Read(ctx, "id1")
			require.NoError(t, err)
			require.Equal(t, idemstore.StateCompleted, r.State)
			require.Equal(t, created, r.Created.Unix())

			res, err = s.Claim(ctx, "id1", idemstore.ClaimRequest{Owner: "own3", Fingerprint: "other", Lease: time.Minute, TTL: time.Hour})
			require.NoError(t, err)
			require.Equal(t, idemstore.ClaimMismatch, res.Status, "a completed record's fingerprint is compared too")

			// A record of an unknown format is refused by every script.
			require.NoError(t, b.c.Set(ctx, rec, "2P|1|own2|fp|1|", time.Hour).Err())
			_, err = s.Claim(ctx, "id1", idemstore.ClaimRequest{Owner: "own3", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
			require.ErrorContains(t, err, "unknown format")
			require.ErrorContains(t, s.Checkpoint(ctx, "id1", "own2", "n", nil), "unknown format")
			require.ErrorContains(t, s.Complete(ctx, "id1", "own2", nil, time.Hour), "unknown format")
			require.ErrorContains(t, s.Release(ctx, "id1", "own2"), "unknown format")
			_, err = s.Read(ctx, "id1")
			require.ErrorContains(t, err, "unknown format")
		}
	})
}

// rawBackend is a Redis and a prefix for tests that read raw keys.
type rawBackend struct {
	c      *redis.Client
	prefix string
}

// forEachRawBackend runs f on miniredis and on a real redis-server (skipped
// when redis-server is not installed).
func forEachRawBackend(t *testing.T, f func(t *testing.T, b rawBackend)) {
	t.Run("miniredis", func(t *testing.T) {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		f(t, rawBackend{c, "idem"})
	})
	t.Run("redis-server", func(t *testing.T) {
		srv := redistest.Shared(t)
		f(t, rawBackend{srv.Client(t), redistest.Prefix(t)})
	})
}

func TestLooksRandom(t *testing.T) {
	random := make([]byte, 10240)
	_, _ = rand.Read(random)
	require.True(t, looksRandom(random), "random bytes")
	text := []byte(strings.Repeat(`{"id":"pay_8f14e45fceea167a5a36dedd4bea2543","amount":1250,"status":"succeeded","note":"Thé café — ünïcode"}`, 100))
	require.False(t, looksRandom(text), "JSON text")
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	require.True(t, looksRandom(all))
	require.False(t, looksRandom(nil))
	// The line: 128 distinct values of the first 256 bytes look random, 127
	// do not; bytes past the 256th are not looked at.
	require.True(t, looksRandom(append(all[:128:128], all[:128]...)))
	require.False(t, looksRandom(append(all[:127:127], make([]byte, 129)...)))
	require.False(t, looksRandom(append(make([]byte, 256), all...)))
}

// TestClaimScriptPaths covers the paths of lua/claim.lua that the common
// ones skip: a lease left without its record, the fence of a mismatch on a
// completed record, a completed record keyed with another listed key, and a
// completed record whose header does not parse.
func TestClaimScriptPaths(t *testing.T) {
	forEachRawBackend(t, func(t *testing.T, b rawBackend) {
		ctx := context.Background()
		s := NewRedisStore(b.c, WithPrefix(b.prefix), WithCompression(0))
		rec, lease := s.Keys("paths")
		claim := func(c idemstore.ClaimRequest) idemstore.ClaimResult {
			t.Helper()
			c.Lease, c.TTL = time.Minute, time.Hour
			res, err := s.Claim(ctx, "paths", c)
			require.NoError(t, err)
			return res
		}

		// A lease without its record (evicted, or deleted by hand): its
		// holder may still run, and no record is written.
		require.NoError(t, b.c.Set(ctx, lease, "holder", time.Minute).Err())
		res := claim(idemstore.ClaimRequest{Owner: "own1", Fingerprint: "fp"})
		require.Equal(t, idemstore.ClaimBusy, res.Status)
		require.Positive(t, res.RetryAfter)
		require.Zero(t, b.c.Exists(ctx, rec).Val())
		require.NoError(t, b.c.Del(ctx, lease).Err())

		// A completed record: the same request replays, another one is a
		// mismatch that reports the record's fence.
		require.NoError(t, b.c.Set(ctx, rec, "1C|7|own1|k1.MAC1|1700000000|=done", time.Hour).Err())
		res = claim(idemstore.ClaimRequest{Owner: "own2", Fingerprint: "k1.MAC1"})
		require.Equal(t, idemstore.ClaimCompleted, res.Status)
		require.Equal(t, int64(7), res.Fence)
		require.Equal(t, []byte("done"), res.Payload)
		res = claim(idemstore.ClaimRequest{Owner: "own2", Fingerprint: "k1.MAC2"})
		require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimMismatch, Fence: 7}, res)
		// Keyed with a key the caller lists besides its current one.
		res = claim(idemstore.ClaimRequest{Owner: "own2", Fingerprint: "k2.MAC9", OtherFingerprints: []string{"k1.MAC1"}})
		require.Equal(t, idemstore.ClaimCompleted, res.Status)
		res = claim(idemstore.ClaimRequest{Owner: "own2", Fingerprint: "k2.MAC9", OtherFingerprints: []string{"k1.MAC2"}})
		require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimMismatch, Fence: 7}, res)
		res = claim(idemstore.ClaimRequest{Owner: "own2", Fingerprint: "k2.MAC9"})
		require.Equal(t, idemstore.ClaimUnreadable, res.Status)

		// A completed record whose header does not parse is refused.
		require.NoError(t, b.c.Set(ctx, rec, "1C|x|own1|k1.MAC1|1700000000|=done", time.Hour).Err())
		_, err := s.Claim(ctx, "paths", idemstore.ClaimRequest{Owner: "own2", Fingerprint: "k1.MAC1", Lease: time.Minute, TTL: time.Hour})
		require.ErrorContains(t, err, "unreadable record")
	})
}

// TestCreatedArg: the record a claim of a fresh key creates (claim.lua's
// ARGV[1]) carries the caller's clock as CREATED, and is built in the call
// without an allocation of its own.
func TestCreatedArg(t *testing.T) {
	s := NewRedisStore(nil, WithPrefix("p"))
	c := s.call(claimScript, "id", true, true)
	before := time.Now().Unix()
	c.freshRecord("own1", "k1.MAC", time.Now().Unix())
	f, err := splitRecord(c.texts[2].String())
	require.NoError(t, err)
	require.Equal(t, recordFields{state: "P", fence: "1", owner: "own1", fp: "k1.MAC", created: f.created}, f)
	sec, err := strconv.ParseInt(f.created, 10, 64)
	require.NoError(t, err)
	require.InDelta(t, before, sec, 1)
	c.done()
	require.Zero(t, testing.AllocsPerRun(10, func() {
		c := s.call(claimScript, "id", true, true)
		c.freshRecord("own1", "k1.MAC", 1700000000)
		c.done()
	}))
}

// TestInspectBoundsDecompression: a record whose payload inflates past
// maxInflated is refused by Inspect and by a replay, with a bounded read.
// The bound is lowered for the test, so that it inflates 3 MiB, not 65.
func TestInspectBoundsDecompression(t *testing.T) {
	require.Equal(t, 64<<20, maxInflated)
	defer func(n int) { maxInflated = n }(maxInflated)
	maxInflated = 2 << 20
	ctx := context.Background()
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	s := NewRedisStore(c)
	var bomb bytes.Buffer
	w, _ := flate.NewWriter(&bomb, flate.BestSpeed)
	_, _ = w.Write(make([]byte, maxInflated+1<<20))
	require.NoError(t, w.Close())
	id := OperationID(KindDo, "", "bomb")
	rec, _ := s.Keys(id)
	require.NoError(t, c.Set(ctx, rec, "1C|1|o|fp|0|z"+bomb.String(), time.Hour).Err())
	_, err := s.Inspect(ctx, id)
	require.ErrorContains(t, err, "bad compressed payload")
	res, err := s.Claim(ctx, id, idemstore.ClaimRequest{Owner: "o2", Fingerprint: "fp", Lease: time.Second, TTL: time.Hour})
	require.ErrorContains(t, err, "bad compressed payload", "a replay of it is refused too: %+v", res)

	// Exactly at the bound: read.
	bomb.Reset()
	w.Reset(&bomb)
	_, _ = w.Write(make([]byte, maxInflated))
	require.NoError(t, w.Close())
	p, err := decodePayload(formatDeflate + bomb.String())
	require.NoError(t, err)
	require.Len(t, p, maxInflated)
}

// TestSplitRecordFields: a record splits into its five fields and the body,
// an empty field included, and refuses another format or too few fields.
func TestSplitRecordFields(t *testing.T) {
	f, err := splitRecord("1C|7||fp|0|a|b")
	require.NoError(t, err)
	require.Equal(t, recordFields{state: "C", fence: "7", owner: "", fp: "fp", created: "0", body: "a|b"}, f)
	for _, bad := range []string{"", "1", "2C|7|o|fp|0|", "1C|7|o|fp"} {
		_, err := splitRecord(bad)
		require.Error(t, err, "%q", bad)
	}
}

// TestEncodePayload: a payload is deflated from WithCompression's size on,
// when deflating makes it smaller, and never when it looks random or
// compression is off; each decodes to itself.
func TestEncodePayload(t *testing.T) {
	text := []byte(strings.Repeat(`{"status":"succeeded"}`, 100)) // 2200 bytes
	random := make([]byte, 4096)
	_, _ = rand.Read(random)
	for _, tc := range []struct {
		name  string
		above int
		p     []byte
		want  string
	}{
		{"below the size", len(text) + 1, text, formatRaw},
		{"at the size", len(text), text, formatDeflate},
		{"compression off", 0, text, formatRaw},
		{"compression off, negative", -1, text, formatRaw},
		{"random", 1, random, formatRaw},
		{"no smaller deflated", 1, []byte("ab"), formatRaw},
	} {
		s := NewRedisStore(nil, WithCompression(tc.above))
		format, stored := s.encodePayload(tc.p)
		require.Equal(t, tc.want, format, tc.name)
		p, err := decodePayload(format + string(stored))
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.p, p, tc.name)
		if format == formatDeflate {
			require.Less(t, len(stored), len(tc.p)/10, tc.name)
		}
	}
}
