package backendtest

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/redistest"
)

// Killable is a Redis a test runs on and may take down for good, as a
// crashed server is: its client gives up fast (one retry, a short dial
// timeout).
type Killable struct {
	Client *redis.Client
	Stop   func() // makes Redis unreachable
	Store  *RedisStore
}

// Guard returns a Guard on the backend's RedisStore.
func (k *Killable) Guard(opts ...idem.Option) *idem.Guard {
	return idem.New(k.Store, opts...)
}

// RedisStore is an idem.RedisStore (waiters subscribe to completions as
// they do in production) whose Busy tells a test when duplicates are
// waiting.
type RedisStore struct {
	*idem.RedisStore
	busyClaims
}

// Claim implements idemstore.Store.
func (s *RedisStore) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	res, err := s.RedisStore.Claim(ctx, id, c)
	s.note(c.Owner, res, err)
	return res, err
}

// ForEachKillable runs f on miniredis and on a real redis-server of the
// test's own.
func ForEachKillable(t *testing.T, f func(t *testing.T, k *Killable)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		f(t, NewKillable(t, mr.Addr(), mr.Close))
	})
	t.Run("redis-server", func(t *testing.T) {
		s := redistest.Start(t)
		f(t, NewKillable(t, s.Addr(), func() { s.Kill(t) }))
	})
}

// NewKillable returns a backend on the Redis at addr, which stop takes down
// (nil when the test never does); its client is closed when the test ends.
func NewKillable(t testing.TB, addr string, stop func()) *Killable {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: 1, DialTimeout: time.Second, DialerRetryTimeout: 5 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	return &Killable{Client: rdb, Stop: stop, Store: &RedisStore{RedisStore: idem.NewRedisStore(rdb)}}
}
