package idem_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemclient"
)

// TestMiddlewareDuplicateJSONNames: bodies whose objects repeat a member
// name mean different things in another order (encoding/json keeps the last
// one, and matches struct fields without regard to case), so they are
// compared byte for byte.
func TestMiddlewareDuplicateJSONNames(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		app := newTestApp()
		h := b.guard(t).Middleware()(app)
		for _, tc := range []struct{ first, other string }{
			{`{"amount":1,"amount":1000}`, `{"amount":1000,"amount":1}`},
			{`{"amount":1,"Amount":1000}`, `{"Amount":1000,"amount":1}`},
			{`{"to":{"iban":"A","iban":"B"}}`, `{"to":{"iban":"B","iban":"A"}}`},
			{`{"amount":1,"amount":1000}`, `{"amount":1, "amount":1000}`},
		} {
			key := idemclient.NewKey()
			q := req{key: key, body: tc.first, contentType: "application/json"}
			rec := serve(h, q)
			require.Equal(t, http.StatusCreated, rec.Code, tc.first)
			run := decodeEcho(t, rec).Run
			q.body = tc.other
			requireProblem(t, serve(h, q), http.StatusUnprocessableEntity, "key-reused")
			q.body = tc.first
			rec = serve(h, q)
			require.Equal(t, "true", rec.Header().Get(idem.ReplayedHeader), "the same bytes replay")
			require.Equal(t, run, decodeEcho(t, rec).Run)
		}
	})
}

// slowBody yields a few bytes, then fails: a client that announced a large
// body and sent almost nothing.
type slowBody struct {
	data []byte
	read int
}

func (s *slowBody) Read(p []byte) (int, error) {
	if s.read >= len(s.data) {
		return 0, io.ErrUnexpectedEOF
	}
	n := copy(p, s.data[s.read:])
	s.read += n
	return n, nil
}

func (s *slowBody) Close() error { return nil }

// allocated returns the bytes the process allocated while f ran.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestMiddlewareBodyGrowsWithBytesRead: the body buffer grows with the
// bytes that arrive, not with the Content-Length a client announces, so
// that connections that send headers only cannot pin memory.
func TestMiddlewareBodyGrowsWithBytesRead(t *testing.T) {
	app := newTestApp()
	h := idem.New(nil, quiet).Middleware()(app) // the body is read before the store is asked
	const announced = 1 << 20
	var rec *httptest.ResponseRecorder
	n := allocated(func() {
		r := httptest.NewRequest(http.MethodPost, "/pay", nil)
		r.Header.Set("Idempotency-Key", "k")
		r.Body, r.ContentLength = &slowBody{data: []byte(`{"amount":`)}, announced
		rec = httptest.NewRecorder()
		h.ServeHTTP(rec, r)
	})
	requireProblem(t, rec, http.StatusBadRequest, "body-unreadable")
	require.Less(t, n, uint64(64<<10), "allocated %d bytes for a body of 10 announced as %d", n, announced)

	// A body that arrives whole is read whole, at most twice its size
	// allocated.
	body := strings.Repeat("x", announced)
	n = allocated(func() {
		r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(body))
		r.Header.Set("Idempotency-Key", "k")
		rec = httptest.NewRecorder()
		h.ServeHTTP(rec, r)
	})
	requireProblem(t, rec, http.StatusServiceUnavailable, "store-unavailable")
	require.Less(t, n, uint64(3*announced), "allocated %d bytes for a body of %d", n, announced)

	// Without a length, reading stops one byte past the limit.
	small := idem.New(nil, quiet).Middleware(idem.WithMaxRequestBody(1000))(app)
	n = allocated(func() {
		r := httptest.NewRequest(http.MethodPost, "/pay", io.NopCloser(strings.NewReader(body)))
		r.ContentLength = -1
		r.Header.Set("Idempotency-Key", "k")
		rec = httptest.NewRecorder()
		small.ServeHTTP(rec, r)
	})
	requireProblem(t, rec, http.StatusRequestEntityTooLarge, "body-too-large")
	require.Less(t, n, uint64(64<<10), "allocated %d bytes for a limit of 1000", n)
	require.Zero(t, app.runs.Load())
}

// TestMiddlewareHeadersOnlyConnections: through a real server, clients that
// announce a megabyte and send nothing do not make the server allocate it.
func TestMiddlewareHeadersOnlyConnections(t *testing.T) {
	const clients, announced = 20, 1 << 20
	mw := idem.New(nil, quiet).Middleware()(newTestApp())
	waiting := make(chan struct{}, clients) // a server has read what it got and waits for more
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = &readSignal{ReadCloser: r.Body, after: len(`{"a":`), waiting: waiting}
		mw.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	var before, during runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var writers []*io.PipeWriter
	done := make(chan struct{}, clients)
	for range clients {
		pr, pw := io.Pipe()
		writers = append(writers, pw)
		r, err := http.NewRequest(http.MethodPost, srv.URL+"/pay", pr)
		require.NoError(t, err)
		r.ContentLength = announced
		r.Header.Set("Idempotency-Key", "k")
		go func() {
			if resp, err := http.DefaultClient.Do(r); err == nil {
				resp.Body.Close()
			}
			done <- struct{}{}
		}()
		_, err = pw.Write([]byte(`{"a":`)) // a few bytes, then silence
		require.NoError(t, err)
	}
	for range clients {
		<-waiting
	}
	runtime.ReadMemStats(&during)
	for _, pw := range writers {
		pw.CloseWithError(io.ErrUnexpectedEOF)
	}
	for range clients {
		<-done
	}
	grew := during.TotalAlloc - before.TotalAlloc
	require.Less(t, grew, uint64(clients*announced/4), "allocated %d bytes for %d connections", grew, clients)
}

// readSignal is a request body that signals when it is read again after
// the first bytes it delivered: the reader has taken them and waits for more.
type readSignal struct {
	io.ReadCloser
	after, got int
	waiting    chan<- struct{}
}

func (r *readSignal) Read(p []byte) (int, error) {
	if r.got >= r.after && r.waiting != nil {
		r.waiting <- struct{}{}
		r.waiting = nil
	}
	n, err := r.ReadCloser.Read(p)
	r.got += n
	return n, err
}

// TestMiddlewareDeepJSONBody: a megabyte of JSON nested 10,000 deep is
// fingerprinted in milliseconds, and its canonical form still matches a
// re-serialised retry.
func TestMiddlewareDeepJSONBody(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		app := newTestApp()
		h := b.guard(t).Middleware(idem.WithMaxRequestBody(2 << 20))(app)
		deep := func(pad string, swap bool) string {
			var s strings.Builder
			for range 9999 {
				if swap {
					s.WriteString(`{"a":1,"z":"` + pad + `","b":`)
				} else {
					s.WriteString(`{"z":"` + pad + `", "a":1,"b":`)
				}
			}
			s.WriteString("null")
			s.WriteString(strings.Repeat("}", 9999))
			return s.String()
		}
		pad := strings.Repeat("p", 80)
		start := time.Now()
		rec := serve(h, req{key: "deep", path: "/status?code=201", body: deep(pad, false), contentType: "application/json"})
		took := time.Since(start)
		require.Equal(t, http.StatusCreated, rec.Code)
		t.Logf("1 MiB, 9999 deep: %v", took)
		rec = serve(h, req{key: "deep", path: "/status?code=201", body: deep(pad, true), contentType: "application/json"})
		require.Equal(t, "true", rec.Header().Get(idem.ReplayedHeader), "member order does not matter")
		require.True(t, bytes.Contains(rec.Body.Bytes(), []byte(`"run":1`)))
	})
}
