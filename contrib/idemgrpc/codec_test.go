package idemgrpc

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestPayloadRoundTrip(t *testing.T) {
	p, err := codec.EncodeMessage(wrapperspb.String("x"))
	require.NoError(t, err)
	m, st, isStatus, err := codec.Decode(p)
	require.NoError(t, err)
	require.Nil(t, st)
	require.False(t, isStatus)
	require.True(t, proto.Equal(wrapperspb.String("x"), m))

	p, err = codec.EncodeStatus(&spb.Status{Code: 5, Message: "gone"})
	require.NoError(t, err)
	m, st, isStatus, err = codec.Decode(p)
	require.NoError(t, err)
	require.Nil(t, m)
	require.True(t, isStatus)
	require.EqualValues(t, 5, st.GetCode())

	for _, bad := range [][]byte{nil, {'x'}, {'m', 0xff}, append([]byte{'m'}, mustAny(t, "type.googleapis.com/no.Such")...)} {
		_, _, _, err := codec.Decode(bad)
		require.Error(t, err, "%q", bad)
	}
}

func mustAny(t *testing.T, url string) []byte {
	t.Helper()
	p, err := codec.EncodeMessage(wrapperspb.String("x"))
	require.NoError(t, err)
	_, _, _, err = codec.Decode(p)
	require.NoError(t, err)
	b := []byte(strings.Replace(string(p[1:]), "type.googleapis.com/google.protobuf.StringValue", url, 1))
	b[1] = byte(len(url)) // the type_url field's length
	return b
}
