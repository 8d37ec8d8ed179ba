package rpcidem

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/wire"
)

func TestOpKey(t *testing.T) {
	require.Equal(t, "rpc:2:t1:15:/pkg.Svc/Charge:k:1", OpKey("t1", "/pkg.Svc/Charge", "k:1"))
	require.Equal(t, "rpc:0::15:/pkg.Svc/Charge:k", OpKey("", "/pkg.Svc/Charge", "k"))
	// Scope, method and key are apart: no two triples share a key.
	seen := map[string][3]string{}
	for _, c := range [][3]string{
		{"a:1", "/m", "k"}, {"a", ":1/m", "k"}, {"a", "/m", ":k"}, {"a", "/m:", "k"},
		{"", "/m", "k"}, {"t", "/m", "k"}, {"t\x00", "/m", "k"}, {"t\x01", "/m", "k"},
		{strings.Repeat("s", 300), "/m", "k"}, {strings.Repeat("s", 301), "/m", "k"},
	} {
		k := OpKey(c[0], c[1], c[2])
		require.NoError(t, wire.ValidKey(k), "%q", c)
		prev, dup := seen[k]
		require.False(t, dup, "%q and %q share %q", prev, c, k)
		seen[k] = c
	}
	long := OpKey("tenant", "/pkg.Svc/Charge", strings.Repeat("k", 255))
	require.True(t, strings.HasPrefix(long, "rpc#"))
	require.Len(t, long, 4+43)
}

// TestOpKeyLength: the readable form is kept up to 255 bytes, the longest
// key idem.Do takes, and hashed from 256 on; a full method longer than
// scope and key together is written out like any other.
func TestOpKeyLength(t *testing.T) {
	const prefix = "rpc:0::2:/m:" // 12 bytes
	at := OpKey("", "/m", strings.Repeat("k", 255-len(prefix)))
	require.Equal(t, prefix+strings.Repeat("k", 255-len(prefix)), at)
	over := OpKey("", "/m", strings.Repeat("k", 256-len(prefix)))
	require.True(t, strings.HasPrefix(over, "rpc#"), over)

	method := "/payments.v1.PaymentService/CreateCharge"
	require.Equal(t, "rpc:0::40:"+method+":k", OpKey("", method, "k"))
	require.Equal(t, "rpc:1:t:40:"+method+":", OpKey("t", method, ""))
}

// TestReadKey: no value is no key, one value is the key, and a key header
// sent twice is an invalid key naming the header.
func TestReadKey(t *testing.T) {
	key, found, err := ReadKey(nil, "idempotency-key")
	require.NoError(t, err)
	require.False(t, found)
	require.Empty(t, key)

	key, found, err = ReadKey([]string{"k-1"}, "idempotency-key")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "k-1", key)

	_, found, err = ReadKey([]string{"k-1", "k-2"}, "x-key")
	require.ErrorIs(t, err, idem.ErrInvalidKey)
	require.ErrorContains(t, err, "x-key sent 2 times")
	require.False(t, found)
}

func TestParseKey(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"abc", "abc", true},
		{`"abc"`, "abc", true},
		{`"a\"b\\c"`, `a"b\c`, true},
		{`"a\nb"`, "", false},
		{`"abc`, "", false},
		{`"abc"x`, "", false},
		{`""`, "", false},
		{"", "", false},
		{strings.Repeat("k", 255), strings.Repeat("k", 255), true},
		{strings.Repeat("k", 256), "", false},
		{"caf\xc3\xa9", "", false},
	} {
		got, found, err := ReadKey([]string{tc.in}, "idempotency-key")
		if !tc.ok {
			require.ErrorIs(t, err, idem.ErrInvalidKey, "%q", tc.in)
			continue
		}
		require.NoError(t, err, "%q", tc.in)
		require.True(t, found)
		require.Equal(t, tc.want, got)
	}
}

func TestAttemptContext(t *testing.T) {
	a := &idem.Attempt{Key: "k", Fence: 3}
	got, ok := idem.AttemptFrom(idem.ContextWithAttempt(t.Context(), a))
	require.True(t, ok)
	require.Same(t, a, got)
	_, ok = idem.AttemptFrom(t.Context())
	require.False(t, ok)
	type otherKey struct{}
	require.Nil(t, idem.ContextWithAttempt(t.Context(), a).Value(otherKey{}))
}
