package idem

import (
	"strings"
	"testing"
)

// TestValidKeyID: a sealer's key id is 1 to 32 of A-Z, a-z, 0-9, '_', '.'
// and '-', the ends of each range included; the bytes next to them are not.
func TestValidKeyID(t *testing.T) {
	for _, id := range []string{"a", "z", "A", "Z", "0", "9", "_", ".", "-", "k2026-12.a_Z", strings.Repeat("k", maxKeyIDLen)} {
		if err := validKeyID(id); err != nil {
			t.Errorf("%q refused: %v", id, err)
		}
	}
	for _, id := range []string{"", strings.Repeat("k", maxKeyIDLen+1), "`", "{", "@", "[", "/", ":", " ", "k|1", "é"} {
		if validKeyID(id) == nil {
			t.Errorf("%q accepted", id)
		}
	}
}
