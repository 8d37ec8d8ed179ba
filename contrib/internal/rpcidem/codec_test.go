package rpcidem

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// textCodec stands in for protocol buffers: a message is its text, a
// status its text too.
var textCodec = &Codec[string, string]{
	Marshal:         func(b []byte, m string) ([]byte, error) { return append(b, m...), nil },
	MarshalStatus:   func(b []byte, st string) ([]byte, error) { return append(b, st...), nil },
	MarshalAny:      func(b []byte, m string) ([]byte, error) { return append(b, m...), nil },
	UnmarshalAny:    func(b []byte) (string, error) { return string(b), nil },
	UnmarshalStatus: func(b []byte) (string, error) { return string(b), nil },
}

// TestFingerprint: the fingerprint hashes the method's length, the method
// and the encoded request; a change of it would make every stored record
// mismatch its retries.
func TestFingerprint(t *testing.T) {
	fp, err := textCodec.Fingerprint("/pkg.Svc/Charge", "abc")
	require.NoError(t, err)
	require.Equal(t, "LJJSpXSSdVOv1XOyaT_lugBBqXoPX44GuJrhTgeV8io", fp)
	other, err := textCodec.Fingerprint("/pkg.Svc/Charg", "eabc")
	require.NoError(t, err)
	require.NotEqual(t, fp, other, "the method's length keeps method and body apart")

	failing := *textCodec
	failing.Marshal = func([]byte, string) ([]byte, error) { return nil, errors.New("no") }
	_, err = failing.Fingerprint("/m", "x")
	require.ErrorContains(t, err, "encoding the request: no")
}

func TestRecordAndDecode(t *testing.T) {
	p, err := textCodec.RecordMessage("receipt", true)
	require.NoError(t, err)
	require.Equal(t, "mreceipt", string(p))
	m, _, isStatus, err := textCodec.Decode(p)
	require.NoError(t, err)
	require.False(t, isStatus)
	require.Equal(t, "receipt", m)

	_, err = textCodec.RecordMessage("", false)
	require.ErrorIs(t, err, ErrRelease)

	for code, stored := range map[uint32]bool{3: true, 5: true, 6: true, 7: true, 9: true, 11: true, 12: true, 1: false, 2: false, 4: false, 8: false, 10: false, 13: false, 14: false, 16: false} {
		p, err := textCodec.RecordError(errors.New("x"), code, "gone")
		if !stored {
			require.ErrorIs(t, err, ErrRelease, "code %d", code)
			continue
		}
		require.NoError(t, err, "code %d", code)
		_, st, isStatus, err := textCodec.Decode(p)
		require.NoError(t, err)
		require.True(t, isStatus)
		require.Equal(t, "gone", st)
	}
	p, err = textCodec.RecordError(idem.Permanent(errors.New("x")), 13, "final")
	require.NoError(t, err, "a permanent error is stored whatever its code")
	require.Equal(t, "sfinal", string(p))

	for _, bad := range [][]byte{nil, []byte("x")} {
		_, _, _, err := textCodec.Decode(bad)
		require.Error(t, err, "%q", bad)
	}
}
