package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/gateway"
)

// newGuard returns a Guard on a miniredis, with its clock to advance.
func newGuard(t *testing.T, opts ...idem.Option) (*idem.Guard, *miniredis.Miniredis) {
	t.Helper()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { c.Close() })
	return idem.New(idem.NewRedisStore(c), opts...), mr
}

// upstream counts the requests it acts on and records the attempt header
// of each; act says how it answers.
type upstream struct {
	runs     atomic.Int32
	attempts chan string
	srv      *httptest.Server
}

func newUpstream(t *testing.T, act func(w http.ResponseWriter, r *http.Request, run int32)) *upstream {
	u := &upstream{attempts: make(chan string, 16)}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n := u.runs.Add(1)
		u.attempts <- strings.Join(r.Header.Values(gateway.AttemptHeader), ",")
		act(w, r, n)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

// hangUp drops the connection without answering.
func hangUp(w http.ResponseWriter) {
	c, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		c.Close()
	}
}

// gatewayFor returns a handler: the middleware around a reverse proxy to
// target that uses the gateway package.
func gatewayFor(g *idem.Guard, target string, opts ...idem.HTTPOption) http.Handler {
	u, _ := url.Parse(target)
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
		},
		ModifyResponse: func(resp *http.Response) error {
			resp.Body = gateway.WatchBody(resp.Request.Context(), resp.Body)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) { gateway.Fail(w, r, err) },
		Transport:    &http.Transport{ResponseHeaderTimeout: 2 * time.Second},
	}
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = gateway.Prepare(r)
		defer func() {
			if p := recover(); gateway.Aborted(r.Context(), p) {
				panic(p)
			}
		}()
		rp.ServeHTTP(w, r)
	})
	return g.Middleware(opts...)(inner)
}

func post(t *testing.T, h http.Handler, key string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":1}`))
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func problemType(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
	var p struct {
		Type   string
		Status int
	}
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
	require.Equal(t, w.Code, p.Status)
	return p.Type
}

// TestAttemptHeader: the upstream gets the attempt's fence, never the
// client's value; a passed-through request gets no attempt header.
func TestAttemptHeader(t *testing.T) {
	g, _ := newGuard(t)
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ int32) { io.WriteString(w, "ok") })
	h := gatewayFor(g, u.srv.URL, idem.WithOptionalKey())
	w := post(t, h, "k1", gateway.AttemptHeader, "7", gateway.AttemptHeader, "8")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, "1", <-u.attempts)
	w = post(t, h, "", gateway.AttemptHeader, "7")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, "", <-u.attempts, "a client's attempt header never reaches the upstream")
}

// TestFailUnsent: an upstream that refuses connections gets 502
// upstream-unreachable, never stored even where 5xx are, and the key is
// released: the retry runs at once, as attempt 1 again (an attempt never
// sent does not count).
func TestFailUnsent(t *testing.T) {
	g, _ := newGuard(t, idem.WithLease(time.Hour))
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ int32) { io.WriteString(w, "ok") })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "http://" + l.Addr().String()
	l.Close()
	all := idem.WithCacheStatus(func(int) bool { return true })
	w := post(t, gatewayFor(g, closed, all), "k1")
	require.Equal(t, http.StatusBadGateway, w.Code)
	require.Equal(t, gateway.ProblemUnreachable, problemType(t, w))
	w = post(t, gatewayFor(g, u.srv.URL, all), "k1")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, "1", <-u.attempts, "the attempt never sent is taken back: the retry runs at once, as attempt 1 again")
}

// TestFailSent: an upstream that acts and hangs up gets 502
// upstream-failed; the key stays in progress until the lease runs out,
// then the retry is attempt 2, then it is replayed.
func TestFailSent(t *testing.T) {
	const lease = 10 * time.Second
	g, mr := newGuard(t, idem.WithLease(lease))
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request, run int32) {
		if run == 1 {
			hangUp(w)
			return
		}
		io.WriteString(w, "done")
	})
	h := gatewayFor(g, u.srv.URL)
	w := post(t, h, "k1")
	require.Equal(t, http.StatusBadGateway, w.Code)
	require.Equal(t, gateway.ProblemFailed, problemType(t, w))
	require.Equal(t, "1", <-u.attempts)
	w = post(t, h, "k1")
	require.Equal(t, http.StatusConflict, w.Code, "in progress until the lease runs out")
	require.EqualValues(t, 1, u.runs.Load())
	mr.FastForward(lease + time.Second)
	w = post(t, h, "k1")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, "2", <-u.attempts)
	w = post(t, h, "k1")
	require.Equal(t, "true", w.Header().Get(idem.ReplayedHeader))
	require.Equal(t, "done", w.Body.String())
	require.EqualValues(t, 2, u.runs.Load())
}

// TestFailTimeout: a response that does not come in time is 504
// upstream-timeout, and the attempt is abandoned.
func TestFailTimeout(t *testing.T) {
	g, _ := newGuard(t, idem.WithLease(time.Hour))
	release := make(chan struct{})
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ int32) { <-release })
	defer close(release)
	h := gatewayFor(g, u.srv.URL)
	w := post(t, h, "k1")
	require.Equal(t, http.StatusGatewayTimeout, w.Code)
	require.Equal(t, gateway.ProblemTimeout, problemType(t, w))
	w = post(t, h, "k1")
	require.Equal(t, http.StatusConflict, w.Code)
}

// TestBodyBrokenOff: an upstream that breaks off its body after acting
// aborts the client's response and keeps the key in progress.
func TestBodyBrokenOff(t *testing.T) {
	g, _ := newGuard(t, idem.WithLease(time.Hour))
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ int32) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "partial")
		w.(http.Flusher).Flush()
		hangUp(w)
	})
	front := httptest.NewServer(gatewayFor(g, u.srv.URL))
	defer front.Close()
	send := func() (*http.Response, error) {
		r, _ := http.NewRequest(http.MethodPost, front.URL+"/pay", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "k1")
		resp, err := http.DefaultClient.Do(r)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		return resp, err
	}
	_, err := send()
	require.Error(t, err, "the client's response is aborted")
	resp, err := send()
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, resp.StatusCode, "the key stays in progress")
	require.EqualValues(t, 1, u.runs.Load())
}

// TestFailUnkeyed: a passed-through request's failure is answered without
// speaking of a key.
func TestFailUnkeyed(t *testing.T) {
	w := httptest.NewRecorder()
	r, tr := gateway.Track(httptest.NewRequest(http.MethodGet, "/", nil))
	require.False(t, tr.Wrote())
	f := gateway.Fail(w, r, errors.New("connection refused"))
	require.Equal(t, gateway.Unkeyed, f.Verdict)
	require.Equal(t, gateway.ProblemUnreachable, problemType(t, w))
	require.NotContains(t, w.Body.String(), "key")
	require.Equal(t, "no-store", w.Header().Get("Cache-Control"))
	require.Nil(t, gateway.TrackerFrom(httptest.NewRequest(http.MethodGet, "/", nil).Context()))
	require.True(t, (*gateway.Tracker)(nil).Wrote(), "without a trace, the request may have been sent")
}

// TestFailSentReusedConnection: an upstream that hangs up on a reused
// connection after acting on a request with an empty body (which the
// transport may send again when it carries Idempotency-Key) acts once.
func TestFailSentReusedConnection(t *testing.T) {
	g, _ := newGuard(t, idem.WithLease(time.Hour))
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request, run int32) {
		if r.Header.Get("Idempotency-Key") == "k1" {
			hangUp(w)
			return
		}
		io.WriteString(w, "ok")
	})
	h := gatewayFor(g, u.srv.URL)
	for _, key := range []string{"k0", "k1"} {
		r := httptest.NewRequest(http.MethodPost, "/pay", nil)
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if key == "k1" {
			require.Equal(t, http.StatusBadGateway, w.Code)
		}
	}
	require.EqualValues(t, 2, u.runs.Load(), "the upstream acted once on k1")
}

// TestNoReplay: a request without a body gets one the transport does not
// re-send; GetBody is cleared.
func TestNoReplay(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Body = http.NoBody
	r.GetBody = func() (io.ReadCloser, error) { return http.NoBody, nil }
	gateway.NoReplay(r)
	require.Nil(t, r.GetBody)
	require.NotNil(t, r.Body)
	require.NotEqual(t, http.NoBody, r.Body)
	require.EqualValues(t, -1, r.ContentLength)

	r = httptest.NewRequest(http.MethodPost, "/", strings.NewReader("abc"))
	body := r.Body
	gateway.NoReplay(r)
	require.Equal(t, body, r.Body, "a body is kept")
	require.EqualValues(t, 3, r.ContentLength)
}

// TestPrepareUnkeyed: a request outside the middleware keeps its body and
// loses the client's attempt header.
func TestPrepareUnkeyed(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set(gateway.AttemptHeader, "2")
	r = gateway.Prepare(r)
	require.Empty(t, r.Header.Values(gateway.AttemptHeader))
	require.Equal(t, http.NoBody, r.Body)
	require.NotNil(t, gateway.TrackerFrom(r.Context()))
	require.Nil(t, gateway.TrackerFrom(context.Background()))
}
