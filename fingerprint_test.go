package idem

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRequestPrint(t *testing.T) {
	print := func(method, target, ct, body string) string {
		r, err := http.NewRequest(method, "http://h"+target, nil)
		require.NoError(t, err)
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		buf := []byte(body)
		fp := requestPrint(r, r.URL.EscapedPath(), buf)
		require.Equal(t, body, string(buf), "the body is left intact")
		return fp.String()
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
		"; charset=a+json": false, // parameters are not the type
	} {
		require.Equal(t, want, isJSON(ct), ct)
	}
}
