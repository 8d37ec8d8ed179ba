package idem

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
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
		if got := validKey(key) == nil; got != want {
			t.Fatalf("validKey(%q) valid = %v, want %v", key, got, want)
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
		key, err := parseKey(tc.in)
		if !tc.ok {
			require.ErrorIs(t, err, ErrInvalidKey, "%q", tc.in)
			continue
		}
		require.NoError(t, err, "%q", tc.in)
		require.Equal(t, tc.key, key)
	}
}
