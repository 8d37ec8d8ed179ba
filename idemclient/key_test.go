package idemclient

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/wire"
)

// TestKeyFromResponse: through a real http.Client and server, the key the
// transport sent is KeyFrom(resp.Request.Context()), as created (not
// quoted), whichever way it was given; the header carries its sent form.
func TestKeyFromResponse(t *testing.T) {
	var (
		mu       sync.Mutex
		received []string // the key header of each request the server got
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		received = append(received, r.Header.Get("Idempotency-Key"))
		mu.Unlock()
		w.Header().Set(ReplayedHeader, "true")
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)

	for _, tc := range []struct {
		name   string
		opts   []Option
		ctxKey string // WithKey; "": none
		header string // the request's own header; "": none
		want   string // the key; "": a new one
		sent   string // the header sent; "": the quoted key
	}{
		{name: "new key"},
		{name: "WithKey", ctxKey: "abc", want: "abc", sent: `"abc"`},
		{name: "WithKey, escapes", ctxKey: `a"b\c`, want: `a"b\c`, sent: `"a\"b\\c"`},
		{name: "WithKey, bare", opts: []Option{WithBareKey()}, ctxKey: "abc", want: "abc", sent: "abc"},
		{name: "own header, quoted", header: `"mine"`, want: "mine", sent: `"mine"`},
		{name: "own header, bare", header: "mine", want: "mine", sent: "mine"},
		{name: "own header, not a key", header: `"open`, want: `"open`, sent: `"open`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			received = nil
			mu.Unlock()
			client := &http.Client{Transport: NewTransport(nil, tc.opts...)}
			ctx := context.Background()
			if tc.ctxKey != "" {
				ctx = WithKey(ctx, tc.ctxKey)
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("{}"))
			require.NoError(t, err)
			if tc.header != "" {
				req.Header.Set("Idempotency-Key", tc.header)
			}
			resp, err := client.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, "true", resp.Header.Get(ReplayedHeader))
			mu.Lock()
			got := received
			mu.Unlock()
			require.Len(t, got, 1, "a success is sent once")
			sent := got[0]

			key, ok := KeyFrom(resp.Request.Context())
			require.True(t, ok, "the response's request carries the key")
			if tc.want == "" {
				require.NoError(t, wire.ValidKey(key))
				require.Len(t, key, 36, "a NewKey")
				require.Equal(t, `"`+key+`"`, sent)
			} else {
				require.Equal(t, tc.want, key)
				require.Equal(t, tc.sent, sent)
			}
			require.Equal(t, sent, resp.Request.Header.Get("Idempotency-Key"), "the header is what was sent")
			_, ok = KeyFrom(req.Context())
			require.Equal(t, tc.ctxKey != "", ok, "the caller's request is not changed")
		})
	}
}
