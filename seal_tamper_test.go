package idem_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// recordKey returns the Redis key of the record of key under kind.
func recordKey(b *backend, kind idem.Kind, key string) string {
	rk, _ := b.store().Keys(idem.OperationID(kind, "", key))
	return rk
}

// flipLast flips the last byte of a stored record: inside the sealed
// value's tag.
func flipLast(t *testing.T, b *backend, rk string) {
	t.Helper()
	ctx := context.Background()
	v, err := b.client.Get(ctx, rk).Bytes()
	require.NoError(t, err)
	v[len(v)-1] ^= 0x01
	require.NoError(t, b.client.Set(ctx, rk, v, time.Hour).Err())
}

// copyRecord writes the record at from onto to.
func copyRecord(t *testing.T, b *backend, from, to string) {
	t.Helper()
	ctx := context.Background()
	v, err := b.client.Get(ctx, from).Result()
	require.NoError(t, err)
	require.NoError(t, b.client.Set(ctx, to, v, time.Hour).Err())
}

// brokenSealer seals and keys fingerprints like its Sealer, and never opens.
type brokenSealer struct {
	idem.Sealer
	idemstore.FingerprintKeyer
}

func (brokenSealer) Open([]byte, []byte) ([]byte, error) { return nil, errors.New("hsm unreachable") }

// unreadableCase is one way a stored value cannot be read back. spoil
// makes the record of (kind, key) unreadable to g, after g completed it.
type unreadableCase struct {
	name  string
	spoil func(t *testing.T, b *backend, kind idem.Kind, key string)
	guard func(t *testing.T, b *backend) *idem.Guard // the Guard that meets the record
}

func unreadableCases() []unreadableCase {
	return []unreadableCase{
		{name: "flipped byte", spoil: func(t *testing.T, b *backend, kind idem.Kind, key string) {
			flipLast(t, b, recordKey(b, kind, key))
		}},
		{name: "moved from another operation", spoil: func(t *testing.T, b *backend, kind idem.Kind, key string) {
			copyRecord(t, b, recordKey(b, kind, key+"-other"), recordKey(b, kind, key))
		}},
		{name: "Open fails", spoil: func(*testing.T, *backend, idem.Kind, string) {}, guard: func(t *testing.T, b *backend) *idem.Guard {
			s := newSealer(t, "k1", "k1")
			return b.guard(t, idem.WithSealer(brokenSealer{s, s.(idemstore.FingerprintKeyer)}))
		}},
	}
}

func TestSealUnreadableIsRefused(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		ctx := context.Background()
		for _, c := range unreadableCases() {
			t.Run(c.name, func(t *testing.T) {
				log, logged := recordingLogger()
				g := b.guard(t, idem.WithSealer(newSealer(t, "k1", "k1")), idem.WithLogger(log))
				reader := g
				if c.guard != nil {
					reader = c.guard(t, b)
				}
				var runs atomic.Int32
				fn := func(context.Context, *idem.Attempt) (string, error) { runs.Add(1); return "ch_1", nil }
				once := func(context.Context) error { runs.Add(1); return nil }
				h := func(g *idem.Guard) http.Handler { return g.Middleware()(markerHandler(&runs)) }
				prefix := strings.ReplaceAll(c.name, " ", "-")
				for _, key := range []string{prefix, prefix + "-other"} {
					_, err := idem.Do(ctx, g, key, payment{1, "EUR"}, fn)
					require.NoError(t, err)
					_, err = g.Once(ctx, key, once)
					require.NoError(t, err)
					require.Equal(t, http.StatusCreated, serve(h(g), req{key: key, body: "{}"}).Code)
				}
				c.spoil(t, b, idem.KindDo, prefix)
				c.spoil(t, b, idem.KindOnce, prefix)
				c.spoil(t, b, idem.KindHTTP, prefix)
				runs.Store(0)

				_, err := idem.Do(ctx, reader, prefix, payment{1, "EUR"}, fn)
				require.ErrorIs(t, err, idem.ErrUnreadable)
				if c.guard != nil {
					require.ErrorContains(t, err, "hsm unreachable", "the Sealer's own error")
				}
				ran, err := reader.Once(ctx, prefix, once)
				require.ErrorIs(t, err, idem.ErrUnreadable)
				require.False(t, ran)
				requireProblem(t, serve(h(reader), req{key: prefix, body: "{}"}), http.StatusInternalServerError, "response-unreadable")
				require.Zero(t, runs.Load(), "neither fn nor the handler ran")
				if c.guard == nil {
					out := logged()
					require.Contains(t, out, "level=ERROR")
					require.Contains(t, out, "key=k1")
					require.NotContains(t, out, string(testKey('1')))
				}
			})
		}
	})
}

func TestSealUnreadableCheckpoint(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		ctx := context.Background()
		g := sealedGuard(t, b, "k1")
		var runs atomic.Int32
		failing := func(ctx context.Context, a *idem.Attempt) (string, error) {
			runs.Add(1)
			if err := a.Checkpoint(ctx, "charge", []byte("ch_1")); err != nil {
				return "", err
			}
			if err := a.Checkpoint(ctx, "refund", []byte("re_1")); err != nil {
				return "", err
			}
			return "", errors.New("timeout")
		}
		for _, key := range []string{"src", "flipped"} {
			_, err := idem.Do(ctx, g, key, payment{1, "EUR"}, failing)
			require.ErrorContains(t, err, "timeout")
		}
		copyRecord(t, b, recordKey(b, idem.KindDo, "src"), recordKey(b, idem.KindDo, "moved"))
		flipLast(t, b, recordKey(b, idem.KindDo, "flipped"))
		runs.Store(0)
		for _, key := range []string{"moved", "flipped"} {
			for range 2 { // the refused claim was released: the second is refused the same way
				_, err := idem.Do(ctx, g, key, payment{1, "EUR"}, okFn("x"))
				require.ErrorIs(t, err, idem.ErrUnreadable, key)
			}
		}
		require.Zero(t, runs.Load())
	})
}
