package idem

import (
	"context"
	_ "embed"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemstore"
)

// claimPrevious is lua/claim.lua as the release before ran it (arguments:
// owner, fingerprint, lease, TTL, ack flag, creation time). During a
// rolling upgrade both scripts run on the same keys.
//
//go:embed testdata/claim_previous.lua
var claimPrevious string

// TestClaimAcrossAnUpgrade: the previous claim.lua and this one on the same
// keys, in both orders: a claim of either is busy to the other while its
// lease lives, a record completed through either replays through both, a
// changed request is a mismatch to both, and a lease that ran out is taken
// over by either with the fence raised and the checkpoints kept.
func TestClaimAcrossAnUpgrade(t *testing.T) {
	forEachRawBackend(t, func(t *testing.T, b rawBackend) {
		ctx := context.Background()
		s := NewRedisStore(b.c, WithPrefix(b.prefix), WithCompression(0))
		prev := redis.NewScript(claimPrevious)
		// claimPrev runs the previous script and parses its reply as the
		// previous release did: a bare record (completed), else an array.
		claimPrev := func(id, owner, fp string) idemstore.ClaimResult {
			t.Helper()
			rec, lease := s.Keys(id)
			v, err := prev.Run(ctx, b.c, []string{rec, lease}, owner, fp, 60000, 3600000, "0", time.Now().Unix()).Result()
			require.NoError(t, err)
			if r, ok := v.(string); ok {
				f, err := splitRecord(r)
				require.NoError(t, err)
				fence, _ := strconv.ParseInt(f.fence, 10, 64)
				p, err := decodePayload(f.body)
				require.NoError(t, err)
				return idemstore.ClaimResult{Status: idemstore.ClaimCompleted, Fence: fence, Payload: p}
			}
			res, err := parseClaimArray(v.([]any))
			require.NoError(t, err)
			return res
		}
		claimNew := func(id, owner, fp string) idemstore.ClaimResult {
			t.Helper()
			res, err := s.Claim(ctx, id, idemstore.ClaimRequest{Owner: owner, Fingerprint: fp, Lease: time.Minute, TTL: time.Hour})
			require.NoError(t, err)
			return res
		}

		// Claimed by the previous script: busy to this one; completed by
		// this release's complete.lua; replayed by both, a mismatch to both.
		require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimOK, Fence: 1}, claimPrev("a", "old1", "fp"))
		require.Equal(t, idemstore.ClaimBusy, claimNew("a", "new1", "fp").Status)
		require.NoError(t, s.Complete(ctx, "a", "old1", []byte("ra"), time.Hour))
		require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimCompleted, Fence: 1, Payload: []byte("ra")}, claimNew("a", "new2", "fp"))
		require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimCompleted, Fence: 1, Payload: []byte("ra")}, claimPrev("a", "old2", "fp"))
		require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimMismatch, Fence: 1}, claimNew("a", "new3", "other"))
		require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimMismatch, Fence: 1}, claimPrev("a", "old3", "other"))

		// Claimed by this one: busy to the previous script; the record is
		// the one the previous script writes.
		require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimOK, Fence: 1}, claimNew("b", "new1", "fp"))
		require.Equal(t, idemstore.ClaimBusy, claimPrev("b", "old1", "fp").Status)
		require.Equal(t, idemstore.ClaimMismatch, claimPrev("b", "old1", "other").Status)
		rec, lease := s.Keys("b")
		f, err := splitRecord(b.c.Get(ctx, rec).Val())
		require.NoError(t, err)
		require.Equal(t, recordFields{state: "P", fence: "1", owner: "new1", fp: "fp", created: f.created}, f)

		// A lease that ran out (a holder that crashed): either takes over,
		// with the fence raised and the checkpoints kept, and the other's
		// claim is then busy.
		require.NoError(t, s.Checkpoint(ctx, "b", "new1", "charge", []byte("ch_1")))
		require.NoError(t, b.c.Del(ctx, lease).Err())
		res := claimPrev("b", "old2", "fp")
		require.Equal(t, idemstore.ClaimOK, res.Status)
		require.EqualValues(t, 2, res.Fence)
		require.Equal(t, []byte("ch_1"), res.Checkpoints["charge"])
		require.Equal(t, idemstore.ClaimBusy, claimNew("b", "new2", "fp").Status)
		require.NoError(t, b.c.Del(ctx, lease).Err())
		res = claimNew("b", "new2", "fp")
		require.Equal(t, idemstore.ClaimOK, res.Status)
		require.EqualValues(t, 3, res.Fence)
		require.Equal(t, []byte("ch_1"), res.Checkpoints["charge"])
		require.Equal(t, idemstore.ClaimBusy, claimPrev("b", "old3", "fp").Status)
		require.NoError(t, s.Complete(ctx, "b", "new2", []byte("rb"), time.Hour))
		require.Equal(t, idemstore.ClaimCompleted, claimPrev("b", "old4", "fp").Status)

		// A tombstone left for this release's claim refuses a late copy of
		// it under either script.
		require.Equal(t, idemstore.ClaimOK, claimNew("c", "new1", "fp").Status)
		require.NoError(t, s.Unclaim(ctx, "c", "new1", time.Minute))
		require.Equal(t, idemstore.ClaimBusy, claimNew("c", "new1", "fp").Status)
		require.Equal(t, idemstore.ClaimBusy, claimPrev("c", "new1", "fp").Status)
		require.Equal(t, idemstore.ClaimOK, claimPrev("c", "old1", "fp").Status)
	})
}
