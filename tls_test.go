package idem_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redistest"
)

// TestRedisTLS: on a redis-server that speaks TLS only, a client whose
// redis.Options.TLSConfig trusts the server's CA claims, completes and
// replays: idem needs nothing of its own for TLS.
func TestRedisTLS(t *testing.T) {
	ctx := context.Background()
	ca := redistest.NewCA(t)
	srv := redistest.StartTLS(t, ca)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), TLSConfig: ca.TLSConfig()})
	t.Cleanup(func() { _ = c.Close() })
	s := idem.NewRedisStore(c)
	require.NoError(t, s.Check(ctx))
	g := idem.New(s)

	runs := 0
	charge := func(_ context.Context, a *idem.Attempt) (string, error) {
		runs++
		require.Equal(t, int64(1), a.Fence)
		return "receipt-1", nil
	}
	first, err := idem.Do(ctx, g, "order-1", "req", charge)
	require.NoError(t, err)
	again, err := idem.Do(ctx, g, "order-1", "req", charge)
	require.NoError(t, err)
	require.Equal(t, "receipt-1", first)
	require.Equal(t, first, again, "the repeat gets the stored result")
	require.Equal(t, 1, runs, "the function ran once")

	rec, _ := s.Keys(idem.OperationID(idem.KindDo, "", "order-1"))
	require.Positive(t, c.Exists(ctx, rec).Val(), "the record is on the TLS server")
}
