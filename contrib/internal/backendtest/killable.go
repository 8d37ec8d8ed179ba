package backendtest

import (
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redistest"
)

// Killable is a Redis a test runs on and may take down for good, as a
// crashed server is: its client gives up fast (one retry, a short dial
// timeout).
type Killable struct {
	Client *redis.Client
	Stop   func() // makes Redis unreachable
}

// Guard returns a Guard on a RedisStore over the backend's client.
func (k *Killable) Guard(opts ...idem.Option) *idem.Guard {
	return idem.New(idem.NewRedisStore(k.Client), opts...)
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
	return &Killable{Client: rdb, Stop: stop}
}
