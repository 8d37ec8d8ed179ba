package idem_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func TestMiddlewareResponseTooLarge(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		app := newTestApp()
		h := b.guard(t).Middleware(idem.WithMaxResponseBody(16))(app)

		// At the limit: stored and replayed whole.
		rec := serve(h, req{key: "fits", path: "/big?n=16"})
		require.Equal(t, http.StatusCreated, rec.Code)
		rec = serve(h, req{key: "fits", path: "/big?n=16"})
		require.Equal(t, strings.Repeat("x", 16), rec.Body.String())
		require.Equal(t, "true", rec.Header().Get(idem.ReplayedHeader))

		// Past it: the first client gets everything, a repeat gets the
		// status, Location and a problem, and the handler does not run again.
		rec = serve(h, req{key: "big", path: "/big?n=100"})
		require.Equal(t, http.StatusCreated, rec.Code)
		require.Equal(t, strings.Repeat("x", 100), rec.Body.String())
		require.Equal(t, "text/plain", rec.Header().Get("Content-Type"))
		rec = serve(h, req{key: "big", path: "/big?n=100"})
		require.Equal(t, http.StatusCreated, rec.Code)
		require.Equal(t, "true", rec.Header().Get(idem.ReplayedHeader))
		require.Equal(t, "/big/1", rec.Header().Get("Location"))
		require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
		var p problemBody
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
		require.Equal(t, problemBase+"response-not-stored", p.Type)
		require.Equal(t, http.StatusCreated, p.Status)
		require.Contains(t, p.Detail, "Do not retry")
		require.EqualValues(t, 2, app.runs.Load())

		// A limit of zero stores the status and Location of every response
		// and no body, for routes whose clients need no more on a retry.
		app = newTestApp()
		h = b.guard(t).Middleware(idem.WithMaxResponseBody(0))(app)
		rec = serve(h, req{key: "bodiless", path: "/big?n=5"})
		require.Equal(t, http.StatusCreated, rec.Code)
		require.Equal(t, "xxxxx", rec.Body.String())
		rec = serve(h, req{key: "bodiless", path: "/big?n=5"})
		require.Equal(t, http.StatusCreated, rec.Code)
		require.Equal(t, "true", rec.Header().Get(idem.ReplayedHeader))
		require.Equal(t, "/big/1", rec.Header().Get("Location"))
		require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
		require.EqualValues(t, 1, app.runs.Load())
	})
}

// TestMiddlewareResponseInPieces: a body written in pieces, by Write or
// WriteString, is held and replayed whole up to the limit exactly, and sent
// as written past it.
func TestMiddlewareResponseInPieces(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t)
		for _, tc := range []struct {
			name   string
			pieces []string
			stored bool
		}{
			{"Write, to the limit", []string{"abc", "defgh"}, true},
			{"WriteString, to the limit", []string{"abc", "defgh"}, true},
			{"Write, one byte past", []string{"abc", "defghi"}, false},
			{"WriteString, one byte past", []string{"abc", "defghi"}, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				h := g.Middleware(idem.WithMaxResponseBody(8))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.WriteHeader(201)
					for _, p := range tc.pieces {
						if strings.HasPrefix(tc.name, "WriteString") {
							_, _ = w.(io.StringWriter).WriteString(p)
						} else {
							_, _ = w.Write([]byte(p))
						}
					}
				}))
				want := strings.Join(tc.pieces, "")
				rec := serve(h, req{key: tc.name})
				require.Equal(t, 201, rec.Code)
				require.Equal(t, want, rec.Body.String())
				rec = serve(h, req{key: tc.name})
				require.Equal(t, 201, rec.Code)
				require.Equal(t, "true", rec.Header().Get(idem.ReplayedHeader))
				if tc.stored {
					require.Equal(t, want, rec.Body.String())
				} else {
					require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
				}
			})
		}
	})
}

// TestMiddlewareLargestStatus: 999, the largest status net/http allows,
// goes through (as a server error: not stored, the handler runs again).
func TestMiddlewareLargestStatus(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		var runs atomic.Int32
		h := b.guard(t).Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(999)
		}))
		for range 2 {
			require.Equal(t, 999, serve(h, req{key: "k"}).Code)
		}
		require.EqualValues(t, 2, runs.Load())
	})
}
