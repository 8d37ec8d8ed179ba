package redistest

import (
	"context"
	"crypto/x509"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestStartTLS: a server started by StartTLS answers only over TLS, to
// clients that trust its CA.
func TestStartTLS(t *testing.T) {
	ctx := context.Background()
	ca := NewCA(t)
	s := StartTLS(t, ca)
	require.NoError(t, s.Client(t).Set(ctx, "k", "v", 0).Err())
	require.Equal(t, "v", s.Client(t).Get(ctx, "k").Val())
	s.FlushAll(t)
	require.Zero(t, s.Client(t).DBSize(ctx).Val())

	plain := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = plain.Close() })
	require.Error(t, plain.Ping(ctx).Err(), "no plain TCP on the TLS port")

	o := s.Options()
	o.TLSConfig = NewCA(t).TLSConfig()
	other := redis.NewClient(o)
	t.Cleanup(func() { _ = other.Close() })
	var unknown x509.UnknownAuthorityError
	require.ErrorAs(t, other.Ping(ctx).Err(), &unknown, "another CA is not trusted")
}
