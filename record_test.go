package idem

import (
	"strconv"
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

// FuzzDecodeRecord checks that any stored bytes decode to a record or an
// error, never a panic, and that checkpoints round-trip.
func FuzzDecodeRecord(f *testing.F) {
	for _, s := range []string{
		"P|1|owner|fp|", "P|2|o|f|1:a1:b", "C|3|o|f|=v{\"x\":1}", "C|1|o|f|=", "C|1|o|f|z\x01\x00", "C|1|o|f|zgarbage", "P|x|o|f|", "Q|1|o|f|",
		"P|1|o|f|9:a", "P|1|o|f|-1:", "P|1|o|f|1:a", "", "|||||",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		r, err := decodeRecord(v)
		if err != nil {
			return
		}
		if r.State != StateInProgress && r.State != StateCompleted {
			t.Fatalf("decoded state %v", r.State)
		}
		if r.State == StateInProgress {
			enc := encodeCheckpoints(r.Checkpoints)
			back, err := decodeCheckpoints(enc)
			if err != nil || len(back) != len(r.Checkpoints) {
				t.Fatalf("checkpoints do not round-trip: %q -> %q (%v)", v, enc, err)
			}
		}
	})
}

// encodeCheckpoints encodes checkpoints as lua/checkpoint.lua does.
func encodeCheckpoints(m map[string][]byte) string {
	var b strings.Builder
	for k, v := range m {
		b.WriteString(strconv.Itoa(len(k)) + ":" + k + strconv.Itoa(len(v)) + ":" + string(v))
	}
	return b.String()
}
