package idem

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDecodeResultLikeUnmarshal: a stored JSON result decodes to what
// json.Unmarshal makes of it, with its error, whatever came before on the
// reused decoders: trailing bytes, space around the value, a value of
// another type, a truncated one, a number at the top.
func TestDecodeResultLikeUnmarshal(t *testing.T) {
	type res struct {
		ID     string `json:"id"`
		Amount int    `json:"amount"`
	}
	inputs := []string{
		`{"id":"a","amount":1}`,
		`{"id":"a","amount":1}{"id":"b"}`,
		`{"id":"a","amount":1}]`,
		` {"id":"a"}`,
		`{"id":"a"} `,
		`{"id":"a","amount":"x"}`,
		`{"id":"a","amount":`,
		`{"amount":2}`,
		`[1,2]`,
		`12`,
		`null`,
		``,
	}
	for range 2 { // each input again after all the others
		for _, in := range inputs {
			var want res
			werr := json.Unmarshal([]byte(in), &want)
			got, err := decodeResult[res](append([]byte{payloadValue}, in...))
			require.Equal(t, want, got, "%q", in)
			require.Equal(t, werr == nil, err == nil, "%q: %v", in, err)
			if werr != nil {
				require.ErrorContains(t, err, werr.Error(), "%q", in)
			}

			var wantN float64
			nerr := json.Unmarshal([]byte(in), &wantN)
			gotN, err := decodeResult[float64](append([]byte{payloadValue}, in...))
			require.Equal(t, wantN, gotN, "%q", in)
			require.Equal(t, nerr == nil, err == nil, "%q: %v", in, err)
		}
	}
}

// TestDecodeValueLeavesNothing: a pooled value decoded into is zeroed
// again, so that the next result of its type holds nothing of the last.
func TestDecodeValueLeavesNothing(t *testing.T) {
	type res struct {
		A, B string
	}
	v, ok := decodeValue[res]([]byte(`{"A":"1","B":"2"}`))
	require.True(t, ok)
	require.Equal(t, res{"1", "2"}, v)
	v, ok = decodeValue[res]([]byte(`{"B":"3"}`))
	require.True(t, ok)
	require.Equal(t, res{B: "3"}, v)
}
