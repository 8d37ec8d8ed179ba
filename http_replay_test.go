package idem_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5/middleware"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestMiddlewareStoresBodyHeaders: the headers that describe the body are
// replayed with it, so that the replayed bytes mean what they meant.
func TestMiddlewareStoresBodyHeaders(t *testing.T) {
	described := map[string]string{
		"Content-Type":        "application/pdf",
		"Content-Encoding":    "br",
		"Content-Language":    "fr-CH",
		"Content-Disposition": `attachment; filename="receipt.pdf"`,
		"Content-Range":       "bytes 0-3/8",
		"Vary":                "Accept-Language",
		"Cache-Control":       "private, max-age=60",
		"Location":            "/receipts/1",
		"Content-Location":    "/receipts/1.pdf",
		"Etag":                `"r1"`,
		"Last-Modified":       "Tue, 01 Dec 2026 10:00:00 GMT",
	}
	forEachBackend(t, func(t *testing.T, b *backend) {
		h := b.guard(t).Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for k, v := range described {
				w.Header().Set(k, v)
			}
			w.Header().Set("Set-Cookie", "session=secret")
			w.Header().Set("Authorization", "Bearer secret")
			w.Header().Set("X-Other", "not stored")
			w.WriteHeader(http.StatusPartialContent)
			_, _ = w.Write([]byte{0xce, 0xb2, 0x04, 0x80})
		}))
		first := serve(h, req{key: "k"})
		replay := serve(h, req{key: "k"})
		require.Equal(t, "true", replay.Header().Get(idem.ReplayedHeader))
		require.Equal(t, http.StatusPartialContent, replay.Code)
		require.Equal(t, first.Body.Bytes(), replay.Body.Bytes())
		for k, v := range described {
			require.Equal(t, []string{v}, replay.Header().Values(k), k)
		}
		for _, k := range []string{"Set-Cookie", "Authorization", "X-Other"} {
			require.Empty(t, replay.Header().Values(k), k)
		}
	})
}

// TestMiddlewareCompressedReplay: chi's Compress inside the guard gzips the
// response; the replay is the same gzip bytes, labelled as such.
func TestMiddlewareCompressedReplay(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		app := newTestApp()
		h := b.guard(t).Middleware()(middleware.Compress(5, "application/json")(app))
		gz := http.Header{"Accept-Encoding": {"gzip"}}
		first := serve(h, req{key: "k", body: `{"amount":1000}`, header: gz})
		require.Equal(t, http.StatusCreated, first.Code)
		require.Equal(t, "gzip", first.Header().Get("Content-Encoding"), "the handler compressed")
		replay := serve(h, req{key: "k", body: `{"amount":1000}`, header: gz})
		require.Equal(t, "true", replay.Header().Get(idem.ReplayedHeader))
		require.Equal(t, first.Body.Bytes(), replay.Body.Bytes(), "byte for byte")
		require.Equal(t, "gzip", replay.Header().Get("Content-Encoding"))
		require.Equal(t, first.Header().Values("Vary"), replay.Header().Values("Vary"))
		require.Equal(t, "application/json", replay.Header().Get("Content-Type"))

		zr, err := gzip.NewReader(bytes.NewReader(replay.Body.Bytes()))
		require.NoError(t, err)
		plain, err := io.ReadAll(zr)
		require.NoError(t, err)
		require.Contains(t, string(plain), `"run":1`)
		require.EqualValues(t, 1, app.runs.Load())
	})
}

// TestMiddlewareTrailers: trailers the handler declares (in a list in the
// Trailer header, alone in it, or by http.TrailerPrefix) reach the first
// client as trailers only, as net/http sends them without the middleware,
// and its headers as headers. They are not stored.
func TestMiddlewareTrailers(t *testing.T) {
	for _, declared := range []string{"X-Checksum, X-Rows", "X-Checksum"} {
		t.Run(declared, func(t *testing.T) { testTrailers(t, declared) })
	}
}

func testTrailers(t *testing.T, declared string) {
	rows := "X-Rows"
	if !strings.Contains(declared, rows) {
		rows = http.TrailerPrefix + rows
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", declared)
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "rows")
		w.Header().Set("X-Checksum", "c0ffee")
		w.Header().Set(rows, "4")
		w.Header().Set(http.TrailerPrefix+"X-Late", "undeclared")
	})
	get := func(t *testing.T, url, key string) *http.Response {
		t.Helper()
		r, err := http.NewRequest(http.MethodPost, url, strings.NewReader("x"))
		require.NoError(t, err)
		r.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(r)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	check := func(t *testing.T, resp *http.Response) {
		t.Helper()
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		require.Equal(t, "text/plain", resp.Header.Get("Content-Type"), "a header stays a header")
		for _, k := range []string{"X-Checksum", "X-Rows", "X-Late"} {
			require.Empty(t, resp.Header.Values(k), "%s is not a header", k)
		}
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, "rows", string(body))
		require.Equal(t, "c0ffee", resp.Trailer.Get("X-Checksum"))
		require.Equal(t, "4", resp.Trailer.Get("X-Rows"))
		require.Equal(t, "undeclared", resp.Trailer.Get("X-Late"))
	}
	bare := httptest.NewServer(handler)
	t.Cleanup(bare.Close)
	check(t, get(t, bare.URL, "k"))

	forEachBackend(t, func(t *testing.T, b *backend) {
		srv := httptest.NewServer(b.guard(t).Middleware()(handler))
		t.Cleanup(srv.Close)
		check(t, get(t, srv.URL, "k"))

		replay := get(t, srv.URL, "k")
		require.Equal(t, "true", replay.Header.Get(idem.ReplayedHeader))
		body, err := io.ReadAll(replay.Body)
		require.NoError(t, err)
		require.Equal(t, "rows", string(body))
		require.Empty(t, replay.Trailer.Get("X-Checksum"), "trailers are not stored")
	})
}
