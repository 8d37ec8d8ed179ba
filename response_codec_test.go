package idem

import (
	"net/http"
	"slices"
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
	require.Equal(t, len(body)+2+1, len(minimal), "a common status and count are one byte, a common Content-Type one")
	odd := encode(payloadResponse, 201, http.Header{"Content-Type": {"application/xml"}}, defaultStoredHeaders, body)
	require.Equal(t, len(body)+2+2+len("application/xml"), len(odd))
	rare := encode(payloadResponse, 299, http.Header{"Content-Type": {"application/json"}}, defaultStoredHeaders, body)
	require.Equal(t, len(body)+4+1, len(rare), "a rare status takes the long form")
	// The bytes are a stored format: records written by one version are
	// replayed by the next.
	for _, enc := range []struct {
		p    []byte
		want string
	}{
		{minimal, "r\t@"}, {odd, "r\t\x01\x0fapplication/xml"}, {rare, "r\x01+\x01@"},
		{encode(payloadResponse, 201, http.Header{"Content-Type": {"text/plain; charset=utf-8"}}, defaultStoredHeaders, body), "r\tC"},
	} {
		require.Equal(t, enc.want, string(enc.p[:len(enc.p)-len(body)]))
	}

	// Too large: the status and the headers that do not describe the body.
	p = encode(payloadTooLarge, 201, h, names, nil)
	r, err = decodeResponse(p)
	require.NoError(t, err)
	require.True(t, r.tooLarge)
	require.Equal(t, []storedHeader{{"Location", "/payments/1"}, {"X-Request-Id", "r1"}, {"X-Request-Id", "r2"}}, r.headers)
	require.Empty(t, r.body)

	for _, bad := range [][]byte{
		nil, {'r'}, {'x', 0, 200, 0}, {'r', 0, 20, 0}, {'r', 0, 200, 1}, {'r', 0, 200, 1, 9, 0}, {'r', 0, 200, 1, 0, 5, 'a'}, {'r', 0, 200, 0xff}, {'r', 0, 200, 1, 0x7f}, {'r', 0, 200, 1, byte(typeCode + len(wellKnownTypes))}, {'r', 0, 200, 1, 0x3f},
		{'r', 0, 200}, {'r', 0xff}, {'r', byte(compactCode + 4*len(wellKnownStatuses))}, {'r', compactCode + 1}, {'r', compactCode + 1, 0x7f},
	} {
		_, err := decodeResponse(bad)
		require.Error(t, err, "%q", bad)
	}

	// A head cut anywhere is refused, never read as another response.
	for _, tag := range []byte{payloadResponse, payloadTooLarge} {
		if tag == payloadTooLarge {
			body = nil
		}
		full := encode(tag, 201, h, names, body)
		for i := range len(full) - len(body) {
			_, err := decodeResponse(full[:i])
			require.Error(t, err, "%c cut at %d of %d: %q", tag, i, len(full), full[:i])
		}
	}
}

// TestResponsePayloadForms: every status and count round-trips, in the
// compact form when it has one, and payloads of the long form written
// before the compact one existed still decode.
func TestResponsePayloadForms(t *testing.T) {
	require.LessOrEqual(t, compactCode+4*len(wellKnownStatuses)-1, 0xff, "compact codes fit a byte")
	for status := 100; status <= 999; status++ {
		for count := range 6 {
			h := http.Header{"X-V": make([]string, count)}
			p := encode(payloadResponse, status, h, []string{"X-V"}, []byte("b"))
			r, err := decodeResponse(p)
			require.NoError(t, err)
			require.Equal(t, status, r.status)
			require.Len(t, r.headers, count)
			require.Equal(t, "b", string(r.body))
			compact := slices.Contains(wellKnownStatuses[:], uint16(status)) && count <= compactCount
			require.Equal(t, compact, p[1] >= compactCode, "status %d, %d values", status, count)
		}
	}
	old := []byte{'r', 0, 201, 2, 0x40, 2, 4, '/', 'p', '/', '1', '{', '}'}
	r, err := decodeResponse(old)
	require.NoError(t, err)
	require.Equal(t, 201, r.status)
	require.Equal(t, []storedHeader{{"Content-Type", "application/json"}, {"Location", "/p/1"}}, r.headers)
	require.Equal(t, "{}", string(r.body))
	old = []byte{'t', 1, 0x2c, 0}
	r, err = decodeResponse(old)
	require.NoError(t, err)
	require.True(t, r.tooLarge)
	require.Equal(t, 300, r.status)
	require.Empty(t, r.headers)
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
