package idem

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemstore"
)

// TestUnclaimScriptPaths: unclaim.lua takes the caller's claim back (the
// fence goes back by one, a record the claim created is deleted, the
// checkpoints stay) and leaves a tombstone in the lease key that refuses a
// late copy of the caller's claim, and only the caller's, for the lease.
func TestUnclaimScriptPaths(t *testing.T) {
	forEachRawBackend(t, func(t *testing.T, b rawBackend) {
		ctx := context.Background()
		s := NewRedisStore(b.c, WithPrefix(b.prefix))
		claim := func(id, owner string) idemstore.ClaimResult {
			t.Helper()
			res, err := s.Claim(ctx, id, idemstore.ClaimRequest{Owner: owner, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
			require.NoError(t, err)
			return res
		}
		unclaim := func(id, owner string) {
			t.Helper()
			require.NoError(t, s.Unclaim(ctx, id, owner, time.Minute))
		}

		// A claim that created the record: the record is gone, the
		// tombstone names the owner, Inspect sees no lease.
		rec, lease := s.Keys("new")
		require.Equal(t, idemstore.ClaimOK, claim("new", "o1").Status)
		unclaim("new", "o1")
		require.Zero(t, b.c.Exists(ctx, rec).Val())
		require.Equal(t, "~o1~", b.c.Get(ctx, lease).Val())
		ttl := b.c.PTTL(ctx, lease).Val()
		require.Greater(t, ttl, 50*time.Second)
		in, err := s.Inspect(ctx, "new")
		require.NoError(t, err)
		require.Nil(t, in.Record)
		require.Empty(t, in.LeaseHolder, "a tombstone is no lease")
		// A late copy of o1's claim is refused; another owner claims at
		// fence 1 over the tombstone, and holds the lease.
		require.Equal(t, idemstore.ClaimBusy, claim("new", "o1").Status)
		require.Zero(t, b.c.Exists(ctx, rec).Val(), "a refused copy writes no record")
		res := claim("new", "o2")
		require.Equal(t, idemstore.ClaimOK, res.Status)
		require.EqualValues(t, 1, res.Fence)
		require.Equal(t, "o2", b.c.Get(ctx, lease).Val())

		// A takeover taken back: the fence goes back, the checkpoints stay.
		require.Equal(t, idemstore.ClaimOK, claim("tk", "a").Status)
		require.NoError(t, s.Checkpoint(ctx, "tk", "a", "charge", []byte("ch_1")))
		require.NoError(t, s.Release(ctx, "tk", "a"))
		require.EqualValues(t, 2, claim("tk", "b").Fence)
		unclaim("tk", "b")
		// Two tombstones: a late copy of either claim is refused.
		unclaim("tk", "c")
		_, tkLease := s.Keys("tk")
		require.Equal(t, "~b~c~", b.c.Get(ctx, tkLease).Val())
		require.Equal(t, idemstore.ClaimBusy, claim("tk", "b").Status)
		require.Equal(t, idemstore.ClaimBusy, claim("tk", "c").Status)
		res = claim("tk", "d")
		require.Equal(t, idemstore.ClaimOK, res.Status)
		require.EqualValues(t, 2, res.Fence, "the taken-back attempt's fence is given again")
		require.Equal(t, []byte("ch_1"), res.Checkpoints["charge"])

		// Another owner's live claim: nothing changes, and the take-back
		// asks to be tried again (no tombstone fits beside a live lease).
		require.ErrorIs(t, s.Unclaim(ctx, "tk", "x", time.Minute), errHeldByAnother)
		require.Equal(t, "d", b.c.Get(ctx, tkLease).Val())
		require.NoError(t, s.Complete(ctx, "tk", "d", []byte("done"), time.Hour))
		// A completed record: nothing changes, the replay stays.
		unclaim("tk", "d")
		require.Equal(t, idemstore.ClaimCompleted, claim("tk", "y").Status)

		// Two orphaned claims of one key, which Redis runs after the
		// take-back of the second: that take-back asks again while the
		// first holds the key; once the first is taken back, the second
		// leaves its tombstone beside the first's, and its late copy is
		// refused.
		require.Equal(t, idemstore.ClaimOK, claim("two", "j").Status)
		require.ErrorIs(t, s.Unclaim(ctx, "two", "k", time.Minute), errHeldByAnother)
		unclaim("two", "j")
		unclaim("two", "k")
		_, twoLease := s.Keys("two")
		require.Equal(t, "~j~k~", b.c.Get(ctx, twoLease).Val())
		require.Equal(t, idemstore.ClaimBusy, claim("two", "k").Status)
		require.Equal(t, idemstore.ClaimBusy, claim("two", "j").Status)
		require.EqualValues(t, 1, claim("two", "retry").Fence)
	})
}
