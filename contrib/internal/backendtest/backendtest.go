// Package backendtest runs a test on both Redis servers idem's tests use:
// miniredis, and a real redis-server started by internal/redistest (skipped
// without one, unless IDEM_REQUIRE_REDIS=1), each behind a store that can
// be taken down. The contrib modules' tests share it.
package backendtest

import (
	"context"
	"errors"
	"sync"
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
// does. Its Busy tells a test when duplicates are waiting.
type FaultStore struct {
	idemstore.Store
	Down atomic.Bool
	busyClaims
}

// Claim implements idemstore.Store.
func (s *FaultStore) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	if s.Down.Load() {
		return idemstore.ClaimResult{}, errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	}
	res, err := s.Store.Claim(ctx, id, c)
	s.note(c.Owner, res, err)
	return res, err
}

// busyClaims watches for claimants told that a key is busy.
type busyClaims struct {
	mu    sync.Mutex
	seen  map[string]struct{} // owners told busy since the last call to Busy
	want  int
	ready chan struct{}
}

func (b *busyClaims) note(owner string, res idemstore.ClaimResult, err error) {
	if err != nil || res.Status != idemstore.ClaimBusy {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ready == nil {
		return
	}
	b.seen[owner] = struct{}{}
	if len(b.seen) == b.want {
		close(b.ready)
		b.ready = nil
	}
}

// Busy returns a channel closed once n distinct claimants (calls of Do,
// requests, messages) have been told the key is busy, counted from this
// call on: with WithWait, n duplicates are then waiting. Call it before the
// duplicates start.
func (b *busyClaims) Busy(n int) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := make(chan struct{})
	b.seen, b.want, b.ready = map[string]struct{}{}, n, ch
	return ch
}
