package idem

import (
	"strings"
	"testing"
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
