package idem_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// TestDoAnyReplaysBytesAndStrings: Do[any] whose fn returns a string or a
// []byte gets the same value back on a repeat, of the same type.
// (Regression test: the repeat failed with "stored result is bytes and does
// not decode".)
func TestDoAnyReplaysBytesAndStrings(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t)
		ctx := context.Background()
		tests := []struct {
			name string
			v    any
		}{
			{"string", "receipt"},
			{"bytes", []byte("raw receipt")},
			{"number", 12.5},
			{"object", map[string]any{"charge": "ch_1"}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				runs := 0
				fn := func(context.Context, *idem.Attempt) (any, error) { runs++; return tt.v, nil }
				for range 2 {
					v, err := idem.Do(ctx, g, "any-"+tt.name, nil, fn)
					require.NoError(t, err)
					require.Equal(t, tt.v, v)
				}
				require.Equal(t, 1, runs)
			})
		}
	})
}

// TestDoRefusesUnencodableResultTypes: a result type that can never be
// stored as JSON is refused before the claim: fn does not run its side
// effect and nothing is written. (Regression test: it used to be found out
// only after fn ran.)
func TestDoRefusesUnencodableResultTypes(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	g := idem.New(idem.NewRedisStore(c), quiet)
	ctx := context.Background()
	ran := false
	check := func(t *testing.T, err error) {
		t.Helper()
		require.ErrorContains(t, err, "cannot be stored as JSON")
		require.False(t, ran, "fn ran")
		require.Empty(t, m.Keys(), "the store was touched")
	}
	t.Run("chan", func(t *testing.T) {
		_, err := idem.Do(ctx, g, "k", nil, func(context.Context, *idem.Attempt) (chan int, error) { ran = true; return nil, nil })
		check(t, err)
	})
	t.Run("func", func(t *testing.T) {
		_, err := idem.Do(ctx, g, "k", nil, func(context.Context, *idem.Attempt) (func(), error) { ran = true; return nil, nil })
		check(t, err)
	})
	t.Run("field", func(t *testing.T) {
		type result struct {
			ID   string
			Done chan struct{}
		}
		_, err := idem.Do(ctx, g, "k", nil, func(context.Context, *idem.Attempt) (*result, error) { ran = true; return nil, nil })
		check(t, err)
	})
	t.Run("map key", func(t *testing.T) {
		_, err := idem.Do(ctx, g, "k", nil, func(context.Context, *idem.Attempt) (map[[2]int]string, error) { ran = true; return nil, nil })
		check(t, err)
	})

	// Types with some encodable values pass: unexported or skipped fields,
	// interfaces, their own marshalers, recursive types.
	type tree struct {
		Kids []*tree
		note chan int
		Skip func() `json:"-"`
		Raw  json.RawMessage
		At   time.Time
		Any  any
	}
	v, err := idem.Do(ctx, g, "ok", nil, func(context.Context, *idem.Attempt) (tree, error) {
		return tree{Kids: []*tree{{}}, Any: 1, note: nil}, nil
	})
	require.NoError(t, err)
	require.Len(t, v.Kids, 1)
}

// nilStore is a Store type whose nil pointer would panic in every method.
type nilStore struct{ idemstore.Store }

// TestNilStores: a nil *RedisStore, a typed-nil Store of any type and a
// typed-nil Redis client give ErrStoreUnavailable with a clear message, never
// a panic. (Regression test: they panicked on first use.)
func TestNilStores(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name  string
		store idemstore.Store
		says  string
	}{
		{"nil *RedisStore", (*idem.RedisStore)(nil), "nil *idem.RedisStore"},
		{"typed-nil Store", (*nilStore)(nil), "nil *idem_test.nilStore"},
		{"nil *redis.Client", idem.NewRedisStore((*redis.Client)(nil)), "nil *redis.Client"},
		{"nil *redis.ClusterClient", idem.NewRedisStore((*redis.ClusterClient)(nil)), "nil *redis.ClusterClient"},
		{"nil client", idem.NewRedisStore(nil), "got nil"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := idem.New(tt.store)
			_, err := idem.Do(ctx, g, "k", nil, okFn("x"))
			require.ErrorIs(t, err, idem.ErrStoreUnavailable)
			require.ErrorContains(t, err, tt.says)
			_, err = g.Once(ctx, "m", func(context.Context) error { return nil })
			require.ErrorIs(t, err, idem.ErrStoreUnavailable)
		})
	}
	var s *idem.RedisStore
	require.ErrorIs(t, s.Check(ctx), idem.ErrStoreUnavailable)
	_, err := s.Read(ctx, "id")
	require.ErrorIs(t, err, idem.ErrStoreUnavailable)
}
