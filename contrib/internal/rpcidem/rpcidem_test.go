package rpcidem

import (
	"strings"
	"testing"
	"time"

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

func TestBackoff(t *testing.T) {
	b := backoff{base: 100 * time.Millisecond, limit: time.Second}
	top := func(n int64) int64 { return n - 1 }
	for retry, want := range map[int]time.Duration{1: 100, 2: 200, 3: 400, 4: 800, 5: 1000, 100: 1000} {
		require.Equal(t, want*time.Millisecond-1, b.jittered(retry, top), "retry %d", retry)
	}
	huge := backoff{base: time.Hour, limit: 1<<63 - 1}
	require.Positive(t, huge.jittered(70, top))
	require.Zero(t, b.jittered(3, func(int64) int64 { return 0 }))
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
