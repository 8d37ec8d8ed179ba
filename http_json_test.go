package idem_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func TestKeyFromJSON(t *testing.T) {
	tests := []struct {
		name, ptr, body, key, err string
	}{
		{name: "string", ptr: "/id", body: `{"id":"evt_1"}`, key: "evt_1"},
		{name: "escaped string", ptr: "/id", body: `{"id":"evt\u005f1\/2"}`, key: "evt_1/2"},
		{name: "number as written", ptr: "/n", body: `{"n":12.50}`, key: "12.50"},
		{name: "nested with escapes", ptr: "/a~1b/m~0n/1", body: `{"a/b":{"m~n":["x","y"]}}`, key: "y"},
		{name: "the whole text", ptr: "", body: ` "k" `, key: "k"},
		{name: "boolean", ptr: "/t", body: `{"t":true}`, err: "/t is a boolean, not a string or a number"},
		{name: "array", ptr: "", body: `[]`, err: "the document is an array"},
		{name: "missing element", ptr: "/a/3", body: `{"a":[1]}`, err: "/a/3: no such element"},
		{name: "trailing garbage", ptr: "/id", body: `{"id":"a"} x`, err: "body is not JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key, err := idem.KeyFromJSON(tt.ptr)(nil, []byte(tt.body))
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				require.True(t, strings.HasPrefix(err.Error(), "idem: "))
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.key, key)
		})
	}
}

func TestFingerprintJSON(t *testing.T) {
	fp := idem.FingerprintJSON("/type", "/data")
	printOf := func(body string) []byte {
		t.Helper()
		b, err := fp(nil, []byte(body))
		require.NoError(t, err)
		return b
	}
	base := printOf(`{"type":"a","data":{"x":1,"y":[1,2]},"attempt":1}`)
	require.Equal(t, base, printOf(`{"attempt":7, "data":{"y":[1,2],"x":1},"type":"a"}`), "order, whitespace and other members do not count")
	require.NotEqual(t, base, printOf(`{"type":"a","data":{"x":1,"y":[2,1]}}`))
	require.NotEqual(t, base, printOf(`{"type":"b","data":{"x":1,"y":[1,2]}}`))
	require.NotEqual(t, base, printOf(`{"type":"a","data":{"x":1.0,"y":[1,2]}}`), "numbers as written")
	// Values cannot run into each other's place.
	swap := idem.FingerprintJSON("/a", "/b")
	x, _ := swap(nil, []byte(`{"a":"1","b":"23"}`))
	y, _ := swap(nil, []byte(`{"a":"12","b":"3"}`))
	require.NotEqual(t, x, y)
	// A repeated member name is compared byte for byte, not reordered.
	dup := idem.FingerprintJSON("/data")
	x, _ = dup(nil, []byte(`{"data":{"n":1,"n":2}}`))
	y, _ = dup(nil, []byte(`{"data":{"n":2,"n":1}}`))
	require.NotEqual(t, x, y)
	_, err := fp(nil, []byte(`{"type":"a"}`))
	require.ErrorContains(t, err, "/data: no such member")
	_, err = fp(nil, bytes.Repeat([]byte("{"), 100))
	require.ErrorContains(t, err, "body is not JSON")
}
