package idem

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestResponsePayload(t *testing.T) {
	h := http.Header{
		"Content-Type":  {"application/json"},
		"Location":      {"/payments/1"},
		"Etag":          {`"v1"`},
		"X-Request-Id":  {"r1", "r2"},
		"Set-Cookie":    {"secret"},
		"Last-Modified": {"Tue, 01 Dec 2026 10:00:00 GMT"},
	}
	names := append(append([]string(nil), defaultStoredHeaders...), "X-Request-Id")
	body := []byte(`{"id":"pay_1"}`)
	p := encode(payloadResponse, 201, h, names, body)
	r, err := decodeResponse(p)
	require.NoError(t, err)
	require.False(t, r.tooLarge)
	require.Equal(t, 201, r.status)
	require.Equal(t, body, r.body)
	require.Equal(t, []storedHeader{
		{"Content-Type", "application/json"}, {"Location", "/payments/1"}, {"Etag", `"v1"`},
		{"Last-Modified", "Tue, 01 Dec 2026 10:00:00 GMT"}, {"X-Request-Id", "r1"}, {"X-Request-Id", "r2"},
	}, r.headers)

	// Compact: the body plus a few bytes a header.
	minimal := encode(payloadResponse, 201, http.Header{"Content-Type": {"application/json"}}, defaultStoredHeaders, body)
	require.Equal(t, len(body)+4+1, len(minimal), "a common Content-Type is one byte")
	odd := encode(payloadResponse, 201, http.Header{"Content-Type": {"application/xml"}}, defaultStoredHeaders, body)
	require.Equal(t, len(body)+4+2+len("application/xml"), len(odd))

	// Too large: the status and the headers that do not describe the body.
	p = encode(payloadTooLarge, 201, h, names, nil)
	r, err = decodeResponse(p)
	require.NoError(t, err)
	require.True(t, r.tooLarge)
	require.Equal(t, []storedHeader{{"Location", "/payments/1"}, {"X-Request-Id", "r1"}, {"X-Request-Id", "r2"}}, r.headers)
	require.Empty(t, r.body)

	for _, bad := range [][]byte{nil, {'r'}, {'x', 0, 200, 0}, {'r', 0, 20, 0}, {'r', 0, 200, 1}, {'r', 0, 200, 1, 9, 0}, {'r', 0, 200, 1, 0, 5, 'a'}, {'r', 0, 200, 0xff}, {'r', 0, 200, 1, 0x7f}, {'r', 0, 200, 1, 0x3f}} {
		_, err := decodeResponse(bad)
		require.Error(t, err, "%q", bad)
	}
}

func FuzzDecodeResponse(f *testing.F) {
	f.Add(encode(payloadResponse, 200, http.Header{"Content-Type": {"a"}, "X": {"b"}}, []string{"Content-Type", "X"}, []byte("body")))
	f.Add([]byte{'t', 1, 0x93, 0})
	f.Fuzz(func(t *testing.T, p []byte) {
		r, err := decodeResponse(p) // never panics
		if err != nil {
			return
		}
		var names []string
		h := http.Header{}
		for _, sh := range r.headers {
			if len(names) == 0 || names[len(names)-1] != sh.name {
				names = append(names, sh.name)
			}
			h[sh.name] = append(h[sh.name], sh.value)
		}
		tag := payloadResponse
		if r.tooLarge {
			tag = payloadTooLarge
		}
		r2, err := decodeResponse(encode(tag, r.status, h, names, r.body))
		require.NoError(t, err)
		require.Equal(t, r.status, r2.status)
		require.Equal(t, string(r.body), string(r2.body))
	})
}

// encode returns the payload of a response.
func encode(tag byte, status int, h http.Header, names []string, body []byte) []byte {
	var snap []headerValues
	for k, v := range h {
		snap = append(snap, headerValues{k, v})
	}
	return append(appendHead(nil, tag, status, snap, names), body...)
}
