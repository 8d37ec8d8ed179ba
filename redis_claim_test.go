package idem

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemstore"
)

// TestClaimScriptTombstonePaths: a tombstone of another owner is no lease:
// a fresh key claimed over it gets a lease of the lease's length (not the
// record's TTL), and a re-sent claim of the record's own owner renews its
// lease over it; a tombstone that names the caller, first or not, refuses
// its claim.
func TestClaimScriptTombstonePaths(t *testing.T) {
	forEachRawBackend(t, func(t *testing.T, b rawBackend) {
		ctx := context.Background()
		s := NewRedisStore(b.c, WithPrefix(b.prefix))
		req := func(owner string) idemstore.ClaimRequest {
			return idemstore.ClaimRequest{Owner: owner, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
		}

		rec, lease := s.Keys("fresh")
		require.NoError(t, b.c.Set(ctx, lease, "~gone~", time.Hour).Err())
		res, err := s.Claim(ctx, "fresh", req("o1"))
		require.NoError(t, err)
		require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimOK, Fence: 1}, res)
		require.Equal(t, "o1", b.c.Get(ctx, lease).Val())
		require.LessOrEqual(t, b.c.PTTL(ctx, lease).Val(), time.Minute, "the lease's length, not the record's")
		require.Greater(t, b.c.PTTL(ctx, rec).Val(), time.Minute, "the record's TTL")

		rec, lease = s.Keys("resent")
		require.NoError(t, b.c.Set(ctx, rec, "1P|3|o1|fp|1700000000|", time.Hour).Err())
		require.NoError(t, b.c.Set(ctx, lease, "~other~", time.Hour).Err())
		res, err = s.Claim(ctx, "resent", req("o1"))
		require.NoError(t, err)
		require.Equal(t, idemstore.ClaimOK, res.Status)
		require.EqualValues(t, 3, res.Fence, "a re-sent claim keeps the fence")
		require.Equal(t, "o1", b.c.Get(ctx, lease).Val())
		require.LessOrEqual(t, b.c.PTTL(ctx, lease).Val(), time.Minute)

		// A record in progress of another owner, and a tombstone that names
		// the caller first: a late copy of the caller's claim, refused.
		rec, lease = s.Keys("named")
		require.NoError(t, b.c.Set(ctx, rec, "1P|2|o2|fp|1700000000|", time.Hour).Err())
		require.NoError(t, b.c.Set(ctx, lease, "~o1~o3~", time.Minute).Err())
		res, err = s.Claim(ctx, "named", req("o1"))
		require.NoError(t, err)
		require.Equal(t, idemstore.ClaimBusy, res.Status)
		require.Equal(t, "1P|2|o2|fp|1700000000|", b.c.Get(ctx, rec).Val(), "nothing taken over")
	})
}

// TestClaimReplayComparesInGo: the script returns a completed record whole
// whatever its fingerprint; the store tells a replay from a mismatch and
// from a record keyed with an unlisted key (ClaimRequest.MatchFingerprint),
// and refuses a completed record whose header does not parse, naming it.
func TestClaimReplayComparesInGo(t *testing.T) {
	forEachRawBackend(t, func(t *testing.T, b rawBackend) {
		ctx := context.Background()
		s := NewRedisStore(b.c, WithPrefix(b.prefix), WithCompression(0))
		rec, _ := s.Keys("done")
		claim := func(fp string, others ...string) (idemstore.ClaimResult, error) {
			return s.Claim(ctx, "done", idemstore.ClaimRequest{Owner: "o9", Fingerprint: fp, OtherFingerprints: others,
				Lease: time.Minute, TTL: time.Hour})
		}
		require.NoError(t, b.c.Set(ctx, rec, "1C|4|o1|plain|1700000000|=v", time.Hour).Err())
		res, err := claim("plain")
		require.NoError(t, err)
		require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimCompleted, Fence: 4, Payload: []byte("v")}, res)
		res, err = claim("other")
		require.NoError(t, err)
		require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimMismatch, Fence: 4}, res)
		res, err = claim("k1.MAC")
		require.NoError(t, err)
		require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimUnreadable}, res, "a plain record met by a keyed request")

		for _, bad := range []string{"1C|4|o1|plain|x|=v", "1C||o1|plain|1|=v", "1C|+4|o1|plain|1|=v", "1C|4|o1|plain"} {
			require.NoError(t, b.c.Set(ctx, rec, bad, time.Hour).Err())
			_, err = claim("plain")
			require.ErrorContains(t, err, "unreadable record", bad)
			require.ErrorContains(t, err, rec, bad)
		}
		// A mismatch is told before the payload is read.
		require.NoError(t, b.c.Set(ctx, rec, "1C|4|o1|plain|1|?", time.Hour).Err())
		res, err = claim("other")
		require.NoError(t, err)
		require.Equal(t, idemstore.ClaimMismatch, res.Status)
	})
}
