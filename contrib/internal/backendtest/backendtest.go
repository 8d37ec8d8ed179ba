// Package backendtest runs a test on both Redis servers idem's tests use:
// miniredis, and a real redis-server started by internal/redistest (skipped
// without one, unless IDEM_REQUIRE_REDIS=1), each behind a store that can
// be taken down. The contrib modules' tests share it.
package backendtest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/redistest"
)

// Backend is the Redis a test runs on, behind a store that can be taken
// down.
type Backend struct {
	Store *FaultStore
}

// Guard returns a Guard on the backend's store.
func (b *Backend) Guard(opts ...idem.Option) *idem.Guard { return idem.New(b.Store, opts...) }

// ForEach runs f on miniredis and on a real redis-server.
func ForEach(t *testing.T, f func(t *testing.T, b *Backend)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		f(t, New(t, miniredis.RunT(t).Addr()))
	})
	t.Run("redis-server", func(t *testing.T) {
		f(t, New(t, RedisServer(t)))
	})
}

// New returns a backend on the Redis at addr, closed when the test ends.
func New(t testing.TB, addr string) *Backend {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	return &Backend{Store: &FaultStore{Store: idem.NewRedisStore(rdb)}}
}

// RedisServer starts a redis-server of the test's own (a free 127.0.0.1
// port, no persistence) and returns its address.
func RedisServer(t testing.TB) string {
	t.Helper()
	return redistest.Start(t).Addr()
}

// FaultStore fails every claim while Down is set, as an unreachable Redis
// does.
type FaultStore struct {
	idemstore.Store
	Down atomic.Bool
}

// Claim implements idemstore.Store.
func (s *FaultStore) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	if s.Down.Load() {
		return idemstore.ClaimResult{}, errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	}
	return s.Store.Claim(ctx, id, c)
}
