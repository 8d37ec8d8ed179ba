package idemlambda_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/internal/backendtest"
)

// forEachRedis runs f on miniredis and on a real redis-server
// (internal/redistest: skipped without one, unless IDEM_REQUIRE_REDIS=1).
func forEachRedis(t *testing.T, f func(t *testing.T, addr string)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) { f(t, miniredis.RunT(t).Addr()) })
	t.Run("redis-server", func(t *testing.T) { f(t, backendtest.RedisServer(t)) })
}

// miniredisAddr starts a miniredis for t and returns its address.
func miniredisAddr(t *testing.T) string { return miniredis.RunT(t).Addr() }

// newRedisClient returns a client of the Redis at addr, closed when t ends.
func newRedisClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// instance is one Lambda instance: a Redis client of its own, made once, a
// store that can be taken down and a Guard on it.
type instance struct {
	store *backendtest.FaultStore
	guard *idem.Guard
}

func newInstance(t *testing.T, addr string, opts ...idem.Option) *instance {
	t.Helper()
	b := backendtest.New(t, addr)
	return &instance{store: b.Store, guard: b.Guard(opts...)}
}

// invoke runs handler as Lambda's runtime does (lambda.NewHandler, the
// event as JSON) and returns the response as Lambda would send it. It does
// not fail the test: goroutines call it.
func invoke(ctx context.Context, handler any, event any) ([]byte, error) {
	payload, err := json.Marshal(event)
	if err != nil {
		return nil, err
	}
	// A lambda.Handler reuses its response buffer on its next call: one per
	// call, and a copy of what it answered.
	out, err := lambda.NewHandler(handler).Invoke(ctx, payload)
	return bytes.Clone(out), err
}

// decode returns the JSON in b as a T.
func decode[T any](t testing.TB, b []byte) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal(b, &v), "%s", b)
	return v
}
