package idemconnect_test

// This file is the same in idemgrpc and idemconnect (only the package name
// differs): the core's redis-server harness is internal to the core module.

import (
	"testing"
	"time"

	"github.com/idemkit/idem/internal/redistest"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// backend is the Redis a test runs on.
type backend struct {
	rdb  *redis.Client
	stop func() // makes Redis unreachable
}

// guard returns a Guard on the backend.
func (b *backend) guard(opts ...idem.Option) *idem.Guard {
	return idem.New(idem.NewRedisStore(b.rdb), opts...)
}

// forEachBackend runs f on miniredis and on a real redis-server.
func forEachBackend(t *testing.T, f func(t *testing.T, b *backend)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		f(t, newBackend(t, mr.Addr(), mr.Close))
	})
	t.Run("redis-server", func(t *testing.T) {
		addr, stop := startRedisServer(t)
		f(t, newBackend(t, addr, stop))
	})
}

func newBackend(t testing.TB, addr string, stop func()) *backend {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: 1, DialTimeout: time.Second, DialerRetryTimeout: 5 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	return &backend{rdb: rdb, stop: stop}
}

// startRedisServer starts a redis-server of the test's own (the core's
// internal/redistest harness: a free 127.0.0.1 port, no persistence; skipped
// without redis-server unless IDEM_REQUIRE_REDIS=1), and returns its address
// and a function that kills it, as TestRedisStopped needs.
func startRedisServer(t testing.TB) (string, func()) {
	t.Helper()
	s := redistest.Start(t)
	return s.Addr(), func() { s.Kill(t) }
}
