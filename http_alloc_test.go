package idem_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestMiddlewareAllocs pins the heap allocations of a request through the
// middleware on a store that answers in memory (cannedStore), the handler's
// own included: benchHandler reads the body, sets two headers, and
// cannedStore keeps the payload it completes. The engine's share (Attempt,
// lease, contexts) is in these figures too, and so is every buffer the
// library pools (bodies, fingerprints' printers): one not given back shows
// as an allocation more. Lower them when they drop, never raise them to let
// a change through (Go 1.26 and 1.27 take as many). The request here has a context that is never cancelled, so the
// store timeout's context costs none (withBudget); a server's request
// context can be cancelled, and costs context.WithTimeout's allocations.
func TestMiddlewareAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	// stringHandler answers 200 by WriteString alone, with eight headers
	// (as many as the recorder snapshots without allocating).
	stringHandler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		h := w.Header()
		for _, k := range []string{"Content-Type", "Location", "Etag", "Cache-Control", "Vary", "X-A", "X-B", "X-C"} {
			h[k] = []string{"v"}
		}
		_, _ = io.WriteString(w, benchRespString)
	})
	tests := []struct {
		name          string
		contentType   string
		opts          []idem.HTTPOption
		handler       http.Handler
		status        int
		fresh, replay float64
	}{
		{"JSON body", "application/json", nil, benchHandler, 201, 16, 3},
		{"other body", "application/octet-stream", nil, benchHandler, 201, 16, 3},
		{"WithFingerprint", "application/json", []idem.HTTPOption{
			idem.WithFingerprint(func(r *http.Request, body []byte) ([]byte, error) { return body[:8], nil }),
		}, benchHandler, 201, 16, 3},
		{"WriteString, eight headers", "application/json", nil, stringHandler, 200, 22, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			serve := func(h http.Handler) func() {
				rd := bytes.NewReader(benchBody)
				r := httptest.NewRequest(http.MethodPost, "/payments?source=app", nil)
				r.Body, r.ContentLength = io.NopCloser(rd), int64(len(benchBody))
				r.Header["Content-Type"] = []string{tt.contentType}
				r.Header["Idempotency-Key"] = []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}
				w := &discardWriter{h: http.Header{}}
				return func() {
					rd.Reset(benchBody)
					clear(w.h)
					w.code = 0
					h.ServeHTTP(w, r)
					if w.code != tt.status {
						t.Fatalf("status %d", w.code)
					}
				}
			}
			s := &cannedStore{}
			h := idem.New(s, quiet).Middleware(tt.opts...)(tt.handler)
			fresh := testing.AllocsPerRun(200, serve(h))
			s.replay = true
			replay := testing.AllocsPerRun(200, serve(h))
			t.Logf("allocations per request: %.0f fresh, %.0f replay", fresh, replay)
			require.LessOrEqual(t, fresh, tt.fresh, "fresh request")
			require.LessOrEqual(t, replay, tt.replay, "replay")
		})
	}
}

// TestMiddlewareBodiesDoNotMix: request bodies of every size, one after
// the other, each reach the handler whole and alone, and a body that the
// handler hands to a goroutine still reads whole after the handler returned
// and other requests went through.
func TestMiddlewareBodiesDoNotMix(t *testing.T) {
	type late struct {
		body io.Reader
		want string
	}
	lates := make(chan late, 1)
	h := idem.New(&cannedStore{}, quiet).Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		want := r.URL.Query().Get("want")
		if r.URL.Path == "/late" {
			lates <- late{r.Body, want} // read after the handler returned
			w.WriteHeader(http.StatusAccepted)
			return
		}
		var got bytes.Buffer
		if r.URL.Path == "/writeto" {
			_, _ = r.Body.(io.WriterTo).WriteTo(&tailWriter{t: t, w: &got})
		} else {
			_, _ = io.Copy(&got, r.Body)
		}
		if got.String() != want {
			t.Errorf("%s: handler read %q, want %q", r.URL, got.String(), want)
		}
		w.WriteHeader(http.StatusCreated)
	}))
	send := func(path, body string, length int64) int {
		r := httptest.NewRequest(http.MethodPost, path+"?want="+body, strings.NewReader(body))
		r.ContentLength = length
		r.Header.Set("Idempotency-Key", "k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	for i, n := range []int{3000, 5, 0, 700, 1, 2000, 9} {
		body := strings.Repeat(strconv.Itoa(i), n)
		require.Equal(t, http.StatusCreated, send("/", body, int64(n)))
		require.Equal(t, http.StatusCreated, send("/writeto", body, int64(n)))
		require.Equal(t, http.StatusCreated, send("/", body, -1))
	}
	require.Equal(t, http.StatusAccepted, send("/late", "late-body", 9))
	l := <-lates
	for range 5 {
		send("/", "other-body", 10)
	}
	got, err := io.ReadAll(l.body)
	require.NoError(t, err)
	require.Equal(t, l.want, string(got))
}

// tailWriter checks that the bytes it is given end where their slice ends:
// no writer sees past the body, into a reused buffer.
type tailWriter struct {
	t *testing.T
	w io.Writer
}

func (w *tailWriter) Write(p []byte) (int, error) {
	if cap(p) != len(p) {
		w.t.Errorf("the body's slice has %d bytes past its end", cap(p)-len(p))
	}
	return w.w.Write(p)
}

// TestMiddlewareReplayHeadersApart: the replayed header values of each name
// are a slice of their own, so that appending to one changes no other.
func TestMiddlewareReplayHeadersApart(t *testing.T) {
	s := &cannedStore{}
	h := idem.New(s, quiet).Middleware(idem.WithStoredHeaders("X-Run"))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["X-Run"] = []string{"a", "b"}
		w.Header().Set("Location", "/payments/1")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
	}))
	serve := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Header.Set("Idempotency-Key", "k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	serve()
	s.replay = true
	w := serve()
	require.Equal(t, http.StatusCreated, w.Code)
	got := w.Header()
	for _, k := range []string{"Content-Type", "Location", "X-Run"} {
		got.Add(k, "added")
	}
	require.Equal(t, []string{"application/json", "added"}, got.Values("Content-Type"))
	require.Equal(t, []string{"/payments/1", "added"}, got.Values("Location"))
	require.Equal(t, []string{"a", "b", "added"}, got.Values("X-Run"))
	require.Equal(t, []string{"true"}, got.Values(idem.ReplayedHeader))
}

// TestMiddlewareHandlerContext: the handler's context carries the Attempt
// and the request's own values, and is not cancelled with the request's.
func TestMiddlewareHandlerContext(t *testing.T) {
	type ctxKey struct{}
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	h := idem.New(&cannedStore{}, quiet).Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cancel() // the client leaves while the handler runs
		a, ok := idem.AttemptFrom(r.Context())
		require.True(t, ok)
		require.EqualValues(t, 1, a.Fence)
		require.Equal(t, "v", r.Context().Value(ctxKey{}))
		require.NoError(t, r.Context().Err())
		require.NoError(t, context.Cause(r.Context()))
		w.WriteHeader(http.StatusNoContent)
	}))
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/", nil)
	r.Header.Set("Idempotency-Key", "k")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	require.Equal(t, http.StatusNoContent, w.Code)
}
