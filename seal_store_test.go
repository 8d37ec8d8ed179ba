package idem_test

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// marker is the secret the sealing tests look for in Redis.
const marker = "MARKER-7f3a9c-card-4242"

// dumpRedis reads every key under b's prefix by its type and returns what
// each holds, by key.
func dumpRedis(t *testing.T, b *backend) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	iter := b.client.Scan(ctx, 0, b.prefix+"*", 100).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		typ, err := b.client.Type(ctx, k).Result()
		require.NoError(t, err)
		var v any
		switch typ {
		case "string":
			v, err = b.client.Get(ctx, k).Result()
		case "hash":
			v, err = b.client.HGetAll(ctx, k).Result()
		case "list":
			v, err = b.client.LRange(ctx, k, 0, -1).Result()
		case "set":
			v, err = b.client.SMembers(ctx, k).Result()
		case "zset":
			v, err = b.client.ZRangeWithScores(ctx, k, 0, -1).Result()
		default:
			t.Fatalf("key %s of unexpected type %s", k, typ)
		}
		require.NoError(t, err)
		out[k] = fmt.Sprint(v)
	}
	require.NoError(t, iter.Err())
	return out
}

// requireNowhere checks that no value holds secret, nor its base64 or hex.
func requireNowhere(t *testing.T, dump map[string]string, secret string) {
	t.Helper()
	forms := []string{
		secret,
		base64.StdEncoding.EncodeToString([]byte(secret))[:16],
		base64.RawURLEncoding.EncodeToString([]byte(secret))[:16],
		hex.EncodeToString([]byte(secret)),
		strings.ToUpper(hex.EncodeToString([]byte(secret))),
	}
	require.NotEmpty(t, dump)
	for k, v := range dump {
		for _, f := range forms {
			require.NotContains(t, v, f, "key %s", k)
			require.NotContains(t, k, f)
		}
	}
}

// sealedGuard returns a Guard on b sealed under the keys ids (key material
// derived from each id's last byte), current first.
func sealedGuard(t *testing.T, b *backend, ids ...string) *idem.Guard {
	t.Helper()
	return b.guard(t, idem.WithSealer(newSealer(t, ids[0], ids...)))
}

// markerHandler answers 201 with the marker in Location and body, and
// counts its runs.
func markerHandler(runs *atomic.Int32) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Location", "/payments/"+marker)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"charge":%q}`, marker)
	})
}

func TestSealNothingInClear(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		ctx := context.Background()
		g := sealedGuard(t, b, "k1")
		var runs atomic.Int32
		result := func(ctx context.Context, a *idem.Attempt) (receipt, error) {
			runs.Add(1)
			return receipt{Charge: marker, Fence: a.Fence}, nil
		}
		first, err := idem.Do(ctx, g, "do", payment{10, marker}, result)
		require.NoError(t, err)
		_, perr := idem.Do(ctx, g, "permanent", payment{10, "EUR"}, func(context.Context, *idem.Attempt) (string, error) {
			return "", idem.Permanent(errors.New("declined: " + marker))
		})
		require.ErrorIs(t, perr, idem.ErrPermanent)
		_, err = idem.Do(ctx, g, "checkpoint", payment{10, "EUR"}, func(ctx context.Context, a *idem.Attempt) (string, error) {
			require.NoError(t, a.Checkpoint(ctx, "charge", []byte(marker)))
			return "", errors.New("provider timeout") // released: the checkpoint stays
		})
		require.ErrorContains(t, err, "provider timeout")
		h := g.Middleware()(markerHandler(&runs))
		q := req{key: "http", body: `{"card":"` + marker + `"}`, contentType: "application/json"}
		firstHTTP := serve(h, q)
		require.Equal(t, http.StatusCreated, firstHTTP.Code)

		requireNowhere(t, dumpRedis(t, b), marker)

		again, err := idem.Do(ctx, g, "do", payment{10, marker}, result)
		require.NoError(t, err)
		require.Equal(t, first, again)
		_, err = idem.Do(ctx, g, "permanent", payment{10, "EUR"}, func(context.Context, *idem.Attempt) (string, error) {
			t.Error("a stored Permanent error ran again")
			return "", nil
		})
		require.ErrorIs(t, err, idem.ErrPermanent)
		require.Equal(t, perr.Error(), err.Error())
		v, err := idem.Do(ctx, g, "checkpoint", payment{10, "EUR"}, func(ctx context.Context, a *idem.Attempt) (string, error) {
			return string(a.Checkpoints()["charge"]), nil
		})
		require.NoError(t, err)
		require.Equal(t, marker, v, "the checkpoint opens for the next attempt")
		replay := serve(h, q)
		require.Equal(t, firstHTTP.Code, replay.Code)
		require.Equal(t, firstHTTP.Body.Bytes(), replay.Body.Bytes())
		require.Equal(t, firstHTTP.Header().Get("Location"), replay.Header().Get("Location"))
		require.Equal(t, "true", replay.Header().Get(idem.ReplayedHeader))
		require.Equal(t, int32(2), runs.Load(), "one run of the Do function, one of the handler")
	})
}

func TestSealRotation(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		ctx := context.Background()
		g1 := sealedGuard(t, b, "k1")       // before
		g2 := sealedGuard(t, b, "k2", "k1") // k2 added and made current
		g3 := sealedGuard(t, b, "k2")       // k1 removed
		var runs atomic.Int32
		fn := func(ctx context.Context, a *idem.Attempt) (string, error) {
			runs.Add(1)
			return "ch_" + a.ID[:6], nil
		}
		first, err := idem.Do(ctx, g1, "a", payment{10, "EUR"}, fn)
		require.NoError(t, err)
		got, err := idem.Do(ctx, g2, "a", payment{10, "EUR"}, fn)
		require.NoError(t, err, "a retry after the rotation replays")
		require.Equal(t, first, got)
		_, err = idem.Do(ctx, g2, "a", payment{99, "EUR"}, fn)
		require.ErrorIs(t, err, idem.ErrMismatch, "a changed request is still told apart")
		_, err = idem.Do(ctx, g3, "a", payment{10, "EUR"}, fn)
		require.ErrorIs(t, err, idem.ErrUnreadable, "its key is gone")
		require.Equal(t, int32(1), runs.Load())

		// Written under k2: g3 replays it, g1 (which never had k2) cannot.
		second, err := idem.Do(ctx, g2, "b", payment{10, "EUR"}, fn)
		require.NoError(t, err)
		got, err = idem.Do(ctx, g3, "b", payment{10, "EUR"}, fn)
		require.NoError(t, err)
		require.Equal(t, second, got)
		_, err = idem.Do(ctx, g1, "b", payment{10, "EUR"}, fn)
		require.ErrorIs(t, err, idem.ErrUnreadable)
		require.Equal(t, int32(2), runs.Load())

		// A checkpoint written under k1 is seen by the attempt under k2.
		_, err = idem.Do(ctx, g1, "c", payment{10, "EUR"}, func(ctx context.Context, a *idem.Attempt) (string, error) {
			require.NoError(t, a.Checkpoint(ctx, "charge", []byte("ch_1")))
			return "", errors.New("timeout")
		})
		require.Error(t, err)
		cp, err := idem.Do(ctx, g2, "c", payment{10, "EUR"}, func(ctx context.Context, a *idem.Attempt) (string, error) {
			require.Equal(t, int64(2), a.Fence)
			return string(a.Checkpoints()["charge"]), nil
		})
		require.NoError(t, err)
		require.Equal(t, "ch_1", cp)

		// Once and the middleware follow the same rules.
		ran, err := g1.Once(ctx, "m", func(context.Context) error { return nil })
		require.True(t, ran)
		require.NoError(t, err)
		ran, err = g2.Once(ctx, "m", func(context.Context) error { t.Error("ran again"); return nil })
		require.False(t, ran)
		require.NoError(t, err)
		ran, err = g3.Once(ctx, "m", func(context.Context) error { t.Error("ran again"); return nil })
		require.False(t, ran)
		require.ErrorIs(t, err, idem.ErrUnreadable)

		var handled atomic.Int32
		q := req{key: "h", body: `{"amount":10}`, contentType: "application/json"}
		firstHTTP := serve(g1.Middleware()(markerHandler(&handled)), q)
		require.Equal(t, http.StatusCreated, firstHTTP.Code)
		replay := serve(g2.Middleware()(markerHandler(&handled)), q)
		require.Equal(t, firstHTTP.Body.Bytes(), replay.Body.Bytes())
		require.Equal(t, "true", replay.Header().Get(idem.ReplayedHeader))
		changed := q
		changed.body = `{"amount":11}`
		requireProblem(t, serve(g2.Middleware()(markerHandler(&handled)), changed), http.StatusUnprocessableEntity, "key-reused")
		requireProblem(t, serve(g3.Middleware()(markerHandler(&handled)), q), http.StatusInternalServerError, "response-unreadable")
		require.Equal(t, int32(1), handled.Load())
	})
}

func TestSealTurnedOnOrOff(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		ctx := context.Background()
		plain, sealed := b.guard(t), sealedGuard(t, b, "k1")
		for _, c := range []struct {
			name          string
			writer, other *idem.Guard
		}{{"plain record, sealed Guard", plain, sealed}, {"sealed record, plain Guard", sealed, plain}} {
			key := strings.ReplaceAll(c.name, " ", "-")
			_, err := idem.Do(ctx, c.writer, key, payment{1, "EUR"}, okFn("x"))
			require.NoError(t, err)
			_, err = idem.Do(ctx, c.other, key, payment{1, "EUR"}, func(context.Context, *idem.Attempt) (string, error) {
				t.Errorf("%s: ran again", c.name)
				return "", nil
			})
			require.ErrorIs(t, err, idem.ErrUnreadable, c.name)
		}
	})
}

// TestSealDumpSeesPlaintext keeps the tests above honest: without a Sealer,
// the same scan finds the marker.
func TestSealDumpSeesPlaintext(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		var runs atomic.Int32
		serve(b.guard(t).Middleware()(markerHandler(&runs)), req{key: "plain", body: "{}"})
		found := false
		for _, v := range dumpRedis(t, b) {
			found = found || strings.Contains(v, marker)
		}
		require.True(t, found, "the scan reads stored responses")
	})
}

// onlySealer hides every method of its Sealer but Seal and Open.
type onlySealer struct{ idem.Sealer }

// badKeys is a FingerprintKeyer that gives unusable fingerprint keys.
type badKeys struct {
	idem.Sealer
	current string
	secrets map[string][]byte
}

func (k badKeys) FingerprintKeys() (string, map[string][]byte) { return k.current, k.secrets }

func TestSealFingerprintKeys(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		ctx := context.Background()
		id := idem.OperationID(idem.KindDo, "", "k")
		fingerprint := func(g *idem.Guard, key string) string {
			_, err := idem.Do(ctx, g, key, payment{1, "EUR"}, okFn("x"))
			require.NoError(t, err)
			r, err := b.store().Read(ctx, idem.OperationID(idem.KindDo, "", key))
			require.NoError(t, err)
			return r.Fingerprint
		}
		plain := fingerprint(b.guard(t), "plain")
		require.NotContains(t, plain, ".")
		require.Equal(t, plain, fingerprint(b.guard(t, idem.WithSealer(onlySealer{newSealer(t, "k1", "k1")})), "custom"),
			"a Sealer without FingerprintKeys leaves the fingerprint plain")
		keyed := fingerprint(sealedGuard(t, b, "k1"), "keyed")
		require.True(t, strings.HasPrefix(keyed, "k1."), keyed)
		require.Len(t, keyed, len("k1.")+22, "128 bits, base64url")
		require.NotContains(t, keyed, plain)

		s := newSealer(t, "k1", "k1")
		for _, bad := range []badKeys{
			{Sealer: s, current: "k2", secrets: map[string][]byte{"k1": testKey(1)}},
			{Sealer: s, current: "k,1", secrets: map[string][]byte{"k,1": testKey(1)}},
			{Sealer: s, current: "k1", secrets: map[string][]byte{"k1": testKey(1)[:15]}},
		} {
			_, err := idem.Do(ctx, b.guard(t, idem.WithSealer(bad)), "k", payment{1, "EUR"}, okFn("x"))
			require.ErrorIs(t, err, idem.ErrStoreUnavailable, "%+v", bad.current)
			require.ErrorContains(t, err, "WithSealer")
		}
		r, err := b.store().Read(ctx, id)
		require.NoError(t, err)
		require.Nil(t, r, "nothing claimed")
		shortest := badKeys{Sealer: s, current: "k1", secrets: map[string][]byte{"k1": testKey(1)[:16]}}
		require.True(t, strings.HasPrefix(fingerprint(b.guard(t, idem.WithSealer(shortest)), "shortest"), "k1."),
			"a secret of 16 bytes, the shortest, is taken")
	})
}
