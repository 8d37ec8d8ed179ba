package wire_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/internal/wire"
)

// FuzzValidKey checks that key validation never panics and accepts exactly
// the non-empty printable ASCII keys of at most 255 bytes.
func FuzzValidKey(f *testing.F) {
	for _, s := range []string{"", "a", "5f0c6d1e-8a2b-4c47-9a3e-2f1d8b7c6a50", "{tag}:x", "clé", "a\x00b", strings.Repeat("k", 256)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		want := len(key) > 0 && len(key) <= 255
		for i := 0; i < len(key); i++ {
			if key[i] < ' ' || key[i] > '~' {
				want = false
			}
		}
		if got := wire.ValidKey(key) == nil; got != want {
			t.Fatalf("ValidKey(%q) valid = %v, want %v", key, got, want)
		}
	})
}

func TestParseKey(t *testing.T) {
	for _, tc := range []struct {
		in, key string
		ok      bool
	}{
		{"abc", "abc", true},
		{`"abc"`, "abc", true},
		{`"a\"b\\c"`, `a"b\c`, true},
		{`a"b`, `a"b`, true}, // not an RFC 8941 string: taken as it is
		{"8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{`"` + strings.Repeat("x", 255) + `"`, strings.Repeat("x", 255), true},
		{"", "", false},
		{`""`, "", false},
		{`"`, "", false},
		{`"abc`, "", false},
		{`"abc"d`, "", false},
		{`"abc";a=1`, "", false},
		{`"a\b"`, "", false},
		{`"a\`, "", false},
		{"\"caf\xc3\xa9\"", "", false},
		{"caf\xc3\xa9", "", false},
		{"a\x00", "", false},
		{`"` + strings.Repeat("x", 256) + `"`, "", false},
		{strings.Repeat("x", 256), "", false},
	} {
		key, err := wire.ParseKey(tc.in)
		if !tc.ok {
			require.ErrorIs(t, err, wire.ErrInvalidKey, "%q", tc.in)
			continue
		}
		require.NoError(t, err, "%q", tc.in)
		require.Equal(t, tc.key, key)
	}
}

func TestQuoteKeyRoundTrips(t *testing.T) {
	for _, k := range []string{"abc", `a"b\c`, idemclient.NewKey(), `\`, `"`} {
		got, err := wire.ParseKey(wire.QuoteKey(k))
		require.NoError(t, err)
		require.Equal(t, k, got)
	}
}

func TestIsToken(t *testing.T) {
	for s, want := range map[string]bool{
		"POST": true, "M-SEARCH": true, "x!#$%&'*+-.^_`|~9": true,
		"": false, "PO ST": false, "POST\r": false, "a:b": false, "(x)": false, "P\u00d6ST": false, `"a"`: false, "a/b": false,
	} {
		require.Equal(t, want, wire.IsToken(s), "%q", s)
	}
}

// TestValidKeyEdges: the first and last printable ASCII bytes, and the
// longest key, are valid; one past them is not.
func TestValidKeyEdges(t *testing.T) {
	for key, valid := range map[string]bool{
		" ": true, "~": true, "a b~": true, strings.Repeat("k", wire.MaxKeyLen): true,
		"\x1f": false, "\x7f": false, "a\x7fb": false, strings.Repeat("k", wire.MaxKeyLen+1): false,
	} {
		err := wire.ValidKey(key)
		if valid {
			require.NoError(t, err, "%q", key)
		} else {
			require.ErrorIs(t, err, wire.ErrInvalidKey, "%q", key)
		}
		key, err = wire.ParseKey(`"` + key + `"`)
		if valid {
			require.NoError(t, err, "quoted %q", key)
		} else {
			require.ErrorIs(t, err, wire.ErrInvalidKey, "quoted %q", key)
		}
	}
}

// TestIsTokenEdges: the ends of each range of letters and digits are tchar;
// the bytes beside them are not (but the backquote before a, a tchar).
func TestIsTokenEdges(t *testing.T) {
	for _, b := range "azAZ09" {
		require.True(t, wire.IsToken(string(b)), "%q", b)
	}
	for _, b := range "{@[/:" {
		require.False(t, wire.IsToken(string(b)), "%q", b)
	}
}
