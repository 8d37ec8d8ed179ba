package idem

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestParseKey(t *testing.T) {
	for _, tc := range []struct {
		in, key string
		ok      bool
	}{
		{"abc", "abc", true},
		{`"abc"`, "abc", true},
		{`"a\"b\\c"`, `a"b\c`, true},
		{`a"b`, `a"b`, true}, // not an RFC 8941 string: taken as it is
		{"8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{`"` + strings.Repeat("x", 255) + `"`, strings.Repeat("x", 255), true},
		{"", "", false},
		{`""`, "", false},
		{`"`, "", false},
		{`"abc`, "", false},
		{`"abc"d`, "", false},
		{`"abc";a=1`, "", false},
		{`"a\b"`, "", false},
		{`"a\`, "", false},
		{"\"caf\xc3\xa9\"", "", false},
		{"caf\xc3\xa9", "", false},
		{"a\x00", "", false},
		{`"` + strings.Repeat("x", 256) + `"`, "", false},
		{strings.Repeat("x", 256), "", false},
	} {
		key, err := parseKey(tc.in)
		if !tc.ok {
			require.ErrorIs(t, err, ErrInvalidKey, "%q", tc.in)
			continue
		}
		require.NoError(t, err, "%q", tc.in)
		require.Equal(t, tc.key, key)
	}
}

func TestQuoteKeyRoundTrips(t *testing.T) {
	for _, k := range []string{"abc", `a"b\c`, NewKey(), `\`, `"`} {
		got, err := parseKey(quoteKey(k))
		require.NoError(t, err)
		require.Equal(t, k, got)
	}
}

func canon(t testing.TB, s string) (string, bool) {
	t.Helper()
	out, ok := canonicalJSON(nil, []byte(s))
	return string(out), ok
}

func TestCanonicalJSON(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{" {\n\t\"b\" : [ 1 , 2 ] ,\r\n \"a\" : { \"d\":null, \"c\":true } } ", `{"a":{"c":true,"d":null},"b":[1,2]}`},
		{`{"a":1.0,"b":1e3,"c":-0,"d":0.5E-2}`, `{"a":1.0,"b":1e3,"c":-0,"d":0.5E-2}`},
		{`"\u0041\/\"\\\n\u001f\u00e9\ud83d\ude00"`, "\"A/\\\"\\\\\\n\\u001f\u00e9\U0001F600\""},
		{`"\ud800x"`, `"\ud800x"`},
		{`"\uD800\uDBFF"`, `"\ud800\udbff"`},
		{`{"a":1,"a":0}`, `{"a":0,"a":1}`},
		{`{"\u0062":1,"a":2}`, `{"a":2,"b":1}`},
		{`[]`, `[]`},
		{`{}`, `{}`},
		{` 7 `, `7`},
		{`[{"z":{"y":[{"b":1,"a":2}]},"x":0}]`, `[{"x":0,"z":{"y":[{"a":2,"b":1}]}}]`},
	} {
		got, ok := canon(t, tc.in)
		require.True(t, ok, tc.in)
		require.Equal(t, tc.want, got, tc.in)
	}
	for _, bad := range []string{``, ` `, `{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `[1 2]`, `01`, `1.`, `.5`, `-`, `1e`, `+1`,
		`tru`, `nul`, `"a`, "\"a\x01\"", `"\x"`, `"\u12"`, `{"a":1}x`, `{a:1}`, `NaN`, `[` + strings.Repeat("[", maxJSONDepth+1)} {
		_, ok := canon(t, bad)
		require.False(t, ok, "%q", bad)
	}
}

// FuzzCanonicalJSON checks canonicalJSON against encoding/json: it accepts
// exactly the valid documents, its output is valid and stable, and documents
// that decode to equal values have one canonical form.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[true,null,"x"]}`, `"\u00e9\ud83d\ude00\/"`, `[1.50,-0e+1]`, `{"a":{"a":{}}}`, `  12 `, `{"a":1,"a":2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, ok := canonicalJSON(nil, in)
		require.Equal(t, json.Valid(in), ok, "%q", in)
		if !ok {
			return
		}
		require.True(t, json.Valid(out), "%q -> %q", in, out)
		again, ok := canonicalJSON(nil, out)
		require.True(t, ok)
		require.Equal(t, string(out), string(again), "canonical form is stable")

		// encoding/json replaces invalid UTF-8 and lone surrogates, and
		// keeps one of two equal keys: it is the reference only without them.
		c := canonicalizer{src: in}
		c.value(0)
		if c.dupKeys || !utf8.Valid(in) || bytes.Contains(bytes.ToLower(in), []byte(`\ud`)) {
			return
		}
		var v any
		require.NoError(t, unmarshalNumbers(in, &v))
		re, err := json.Marshal(v)
		require.NoError(t, err)
		viaStdlib, ok := canonicalJSON(nil, re)
		require.True(t, ok)
		require.Equal(t, string(out), string(viaStdlib), "%q", in)
	})
}

func TestRequestPrint(t *testing.T) {
	print := func(method, target, ct, body string) string {
		r, err := http.NewRequest(method, "http://h"+target, nil)
		require.NoError(t, err)
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		path := r.URL.EscapedPath()
		prefix := len(method) + len(path) + len(r.URL.RawQuery) + 4
		buf := append(make([]byte, prefix), body...)
		fp := requestPrint(r, path, buf, prefix)
		require.Equal(t, body, string(buf[prefix:]), "the body is left intact")
		return fp
	}
	base := print("POST", "/p?q=1", "application/json", `{"a":1,"b":2}`)
	require.Equal(t, base, print("POST", "/p?q=1", "application/json; charset=utf-8", "{ \"b\":2,\n\"a\":1 }"))
	require.Equal(t, base, print("POST", "/p?q=1", "Application/JSON", `{"b":2,"a":1}`))
	for _, other := range []string{
		print("PATCH", "/p?q=1", "application/json", `{"a":1,"b":2}`),
		print("POST", "/p?q=2", "application/json", `{"a":1,"b":2}`),
		print("POST", "/p", "application/json", `{"a":1,"b":2}`),
		print("POST", "/p/?q=1", "application/json", `{"a":1,"b":2}`),
		print("POST", "/p?q=1", "text/plain", `{"a":1,"b":2}`),
		print("POST", "/p?q=1", "application/json", `{"a":1,"b":2.0}`),
		// Separators cannot be forged: the path cannot end in the query.
		print("POST", "/p%0Aq=1", "application/json", `{"a":1,"b":2}`),
	} {
		require.NotEqual(t, base, other)
	}
	// Invalid JSON is compared byte for byte.
	require.Equal(t, print("POST", "/", "application/json", `{"a":`), print("POST", "/", "application/json", `{"a":`))
	require.NotEqual(t, print("POST", "/", "application/json", `{"a":`), print("POST", "/", "application/json", `{"a": `))
}

func TestIsJSON(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json": true, "application/json; charset=utf-8": true, " APPLICATION/JSON ;x=y": true,
		"application/problem+json": true, "application/vnd.api+JSON": true,
		"": false, "text/plain": false, "application/jsonx": false, "+json": false, "application/x-ndjson": false,
	} {
		require.Equal(t, want, isJSON(ct), ct)
	}
}

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

// unmarshalNumbers decodes JSON keeping numbers as written.
func unmarshalNumbers(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	return d.Decode(v)
}
