package idem

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemstore"
)

// TestOnceEmptyStoredResult: a completed Once record whose result is empty
// (no tag: a record this version did not write) is a completion without an
// error: Once does not run fn and does not panic.
func TestOnceEmptyStoredResult(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { c.Close() })
	s := NewRedisStore(c)
	ctx := context.Background()
	id := OperationID(KindOnce, "", "m1")
	res, err := s.Claim(ctx, id, idemstore.ClaimRequest{Owner: "o1", Fingerprint: onceFingerprint.String(), Lease: time.Minute, TTL: time.Hour})
	require.NoError(t, err)
	require.Equal(t, idemstore.ClaimOK, res.Status)
	require.NoError(t, s.Complete(ctx, id, "o1", nil, time.Hour))

	ran, err := New(s).Once(ctx, "m1", func(context.Context) error {
		t.Error("fn ran on a completed message")
		return nil
	})
	require.NoError(t, err)
	require.False(t, ran)
}
