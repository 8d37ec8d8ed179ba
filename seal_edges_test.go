package idem_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestAESGCMSealerEdges: an empty value and a key id of the longest length
// seal and open; every cut of a sealed value is refused, and says why: a
// cut inside the head is not the sealer's format, a cut after it is too
// short for a nonce and a tag, a cut inside the ciphertext does not open.
func TestAESGCMSealerEdges(t *testing.T) {
	long := strings.Repeat("k", 32)
	s, err := idem.NewAESGCMSealer(long, map[string][]byte{long: testKey(7)})
	require.NoError(t, err)
	bind := []byte("op\x00result")

	empty, err := s.Seal(nil, bind)
	require.NoError(t, err)
	require.Len(t, empty, 2+len(long)+12+16, "head, nonce and tag")
	got, err := s.Open(empty, bind)
	require.NoError(t, err, "an empty value opens")
	require.Empty(t, got)

	plain := []byte("ch_3MmlLrLkdIwHu7ix0snN0B15")
	sealed, err := s.Seal(plain, bind)
	require.NoError(t, err)
	got, err = s.Open(sealed, bind)
	require.NoError(t, err, "a key id of 32 characters")
	require.Equal(t, plain, got)

	head := 2 + len(long)
	for n := range len(sealed) {
		_, err := s.Open(sealed[:n], bind)
		require.ErrorIs(t, err, idem.ErrUnreadable, "cut to %d bytes", n)
		switch {
		case n < head:
			require.ErrorContains(t, err, "not a value sealed by", "cut to %d bytes", n)
		case n < head+12+16:
			require.ErrorContains(t, err, "but too short", "cut to %d bytes", n)
		default:
			require.ErrorContains(t, err, "does not open", "cut to %d bytes", n)
		}
	}
}
