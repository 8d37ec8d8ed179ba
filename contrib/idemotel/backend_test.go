package idemotel_test

// This file is the same in every contrib module (only the package name
// differs): the core's redis-server harness is internal to the core module.

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/internal/redistest"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// backend is the Redis a test runs on, behind a store that can be taken down.
type backend struct {
	store *faultStore
}

// guard returns a Guard on the backend's store.
func (b *backend) guard(opts ...idem.Option) *idem.Guard { return idem.New(b.store, opts...) }

// forEachBackend runs f on miniredis and on a real redis-server.
func forEachBackend(t *testing.T, f func(t *testing.T, b *backend)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		f(t, newBackend(t, miniredis.RunT(t).Addr()))
	})
	t.Run("redis-server", func(t *testing.T) {
		f(t, newBackend(t, startRedisServer(t)))
	})
}

func newBackend(t *testing.T, addr string) *backend {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	return &backend{store: &faultStore{Store: idem.NewRedisStore(rdb)}}
}

// faultStore fails every claim while down is set, as an unreachable Redis
// does.
type faultStore struct {
	idem.Store
	down atomic.Bool
}

func (s *faultStore) Claim(ctx context.Context, id string, c idem.ClaimRequest) (idem.ClaimResult, error) {
	if s.down.Load() {
		return idem.ClaimResult{}, errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	}
	return s.Store.Claim(ctx, id, c)
}

// startRedisServer starts a redis-server of the test's own (the core's
// internal/redistest harness: a free 127.0.0.1 port, no persistence; skipped
// without redis-server unless IDEM_REQUIRE_REDIS=1) and returns its address.
func startRedisServer(t *testing.T) string {
	t.Helper()
	return redistest.Start(t).Addr()
}
