package idem_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/idemtest"
)

// testKey returns a 32-byte key made of b.
func testKey(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

func newSealer(t testing.TB, current string, ids ...string) idem.Sealer {
	t.Helper()
	keys := map[string][]byte{}
	for _, id := range ids {
		keys[id] = testKey(id[len(id)-1])
	}
	s, err := idem.NewAESGCMSealer(current, keys)
	require.NoError(t, err)
	return s
}

func TestNewAESGCMSealerRefuses(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	for _, tc := range []struct {
		name    string
		current string
		keys    map[string][]byte
		want    string
	}{
		{name: "no keys", current: "k1", keys: nil, want: "no keys"},
		{name: "empty id", current: "", keys: map[string][]byte{"": testKey(1)}, want: "must be 1 to 32"},
		{name: "long id", current: strings.Repeat("k", 33), keys: map[string][]byte{strings.Repeat("k", 33): testKey(1)}, want: "must be 1 to 32"},
		{name: "id with a bar", current: "k|1", keys: map[string][]byte{"k|1": testKey(1)}, want: "only A-Z"},
		{name: "id with a comma", current: "k,1", keys: map[string][]byte{"k,1": testKey(1)}, want: "only A-Z"},
		{name: "AES-128 key", current: "k1", keys: map[string][]byte{"k1": testKey(1)[:16]}, want: "16 bytes; AES-256 needs 32"},
		{name: "a listed key too short", current: "k1", keys: map[string][]byte{"k1": testKey(1), "k0": testKey(2)[:31]}, want: `key "k0" is 31 bytes`},
		{name: "current not listed", current: "k2", keys: map[string][]byte{"k1": testKey(1)}, want: `current key "k2" is not in keys`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := idem.NewAESGCMSealer(tc.current, tc.keys)
			require.Nil(t, s)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), string(secret))
			require.NotContains(t, err.Error(), string(testKey(1)))
		})
	}
}

func TestAESGCMSealer(t *testing.T) {
	s := newSealer(t, "k2", "k1", "k2")
	plain := []byte("ch_3MmlLrLkdIwHu7ix0snN0B15")
	bind := []byte("op\x00result")
	sealed, err := s.Seal(plain, bind)
	require.NoError(t, err)
	require.Len(t, sealed, len(plain)+1+1+len("k2")+12+16, "version, id length, id, nonce and tag")
	require.Equal(t, []byte{1, 2, 'k', '2'}, sealed[:4])
	require.NotContains(t, string(sealed), string(plain))

	got, err := s.Open(sealed, bind)
	require.NoError(t, err)
	require.Equal(t, plain, got)

	again, err := s.Seal(plain, bind)
	require.NoError(t, err)
	require.NotEqual(t, sealed, again, "a fresh nonce per value")

	seen := map[string]bool{}
	for range 1000 { // several refills of the nonce buffer
		v, err := s.Seal(plain, bind)
		require.NoError(t, err)
		nonce := string(v[4 : 4+12])
		require.False(t, seen[nonce], "a nonce repeated")
		seen[nonce] = true
	}

	_, err = s.Open(sealed, []byte("other\x00result"))
	require.ErrorIs(t, err, idem.ErrUnreadable, "another binding")
	for i := range sealed {
		flipped := bytes.Clone(sealed)
		flipped[i] ^= 0x01
		_, err := s.Open(flipped, bind)
		require.ErrorIs(t, err, idem.ErrUnreadable, "byte %d flipped", i)
	}

	// Rotation: a value sealed under k1 opens while k1 is listed.
	old := newSealer(t, "k1", "k1")
	v1, err := old.Seal(plain, bind)
	require.NoError(t, err)
	got, err = s.Open(v1, bind)
	require.NoError(t, err)
	require.Equal(t, plain, got)
	_, err = newSealer(t, "k2", "k2").Open(v1, bind)
	require.ErrorIs(t, err, idem.ErrUnreadable)
	require.ErrorContains(t, err, `sealed with key "k1", which is not listed`)

	// Same id, other key material: does not open.
	other, err := idem.NewAESGCMSealer("k1", map[string][]byte{"k1": testKey(9)})
	require.NoError(t, err)
	_, err = other.Open(v1, bind)
	require.ErrorIs(t, err, idem.ErrUnreadable)
}

func TestAESGCMSealerFingerprintKeys(t *testing.T) {
	s := newSealer(t, "k2", "k1", "k2")
	fk, ok := s.(idemstore.FingerprintKeyer)
	require.True(t, ok)
	current, secrets := fk.FingerprintKeys()
	require.Equal(t, "k2", current)
	require.Len(t, secrets, 2)
	require.Len(t, secrets["k1"], 32)
	require.NotEqual(t, testKey('1'), secrets["k1"], "derived, not the sealing key itself")
	_, again := newSealer(t, "k1", "k1").(idemstore.FingerprintKeyer).FingerprintKeys()
	require.Equal(t, secrets["k1"], again["k1"], "a key's secret does not depend on the others")
	secrets["k1"][0] ^= 1
	_, fresh := fk.FingerprintKeys()
	require.Equal(t, again["k1"], fresh["k1"], "FingerprintKeys returns copies")
}

func FuzzOpen(f *testing.F) {
	s := newSealer(f, "k2", "k1", "k2")
	sealed, err := s.Seal([]byte("value"), []byte("b"))
	require.NoError(f, err)
	f.Add(sealed, []byte("b"))
	f.Add([]byte{}, []byte{})
	f.Add([]byte{1}, []byte("b"))
	f.Add([]byte{1, 0}, []byte("b"))
	f.Add([]byte{1, 2, 'k', '1'}, []byte("b"))
	f.Add([]byte{1, 255, 'k'}, []byte("b"))
	junk := make([]byte, 64)
	rand.Read(junk)
	f.Add(append([]byte{1, 2, 'k', '2'}, junk...), []byte("b"))
	f.Fuzz(func(t *testing.T, in, binding []byte) {
		p, err := s.Open(in, binding)
		if err != nil {
			if !errors.Is(err, idem.ErrUnreadable) {
				t.Fatalf("Open error %v does not wrap ErrUnreadable", err)
			}
			return
		}
		// Only a value sealed under a listed key for this binding opens:
		// the seed (each fuzzing process seals its own, with its own nonce).
		if string(binding) != "b" || string(p) != "value" {
			t.Fatalf("Open(%x, %q) = %q, want an error", in, binding, p)
		}
	})
}

// nilSealer is a Sealer type whose nil pointer would panic.
type nilSealer struct{ idem.Sealer }

// TestNilSealerFailsClosed: WithSealer given a nil Sealer (a
// NewAESGCMSealer error ignored) refuses every operation instead of storing
// in the clear.
func TestNilSealerFailsClosed(t *testing.T) {
	bad, err := idem.NewAESGCMSealer("k1", map[string][]byte{"k1": []byte("short")})
	require.Error(t, err)
	for name, s := range map[string]idem.Sealer{"nil": nil, "from a failed NewAESGCMSealer": bad, "typed nil": (*nilSealer)(nil)} {
		t.Run(name, func(t *testing.T) {
			log, logged := recordingLogger()
			g := idem.New(idemtest.NewMemoryStore(), idem.WithSealer(s), idem.WithLogger(log))
			require.Contains(t, logged(), "event=sealer_missing", "said at construction")
			ran := false
			_, err := idem.Do(t.Context(), g, "k", "req", func(context.Context, *idem.Attempt) (string, error) { ran = true; return "x", nil })
			require.ErrorIs(t, err, idem.ErrStoreUnavailable)
			require.ErrorContains(t, err, "WithSealer got a nil Sealer")
			require.False(t, ran, "nothing runs unsealed")
		})
	}
}
