package idem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/redistest"
)

const problemBase = "https://github.com/idemkit/idem/blob/main/docs/http.md#"

// testApp is the handler behind the middleware in these tests. It counts its
// runs and answers by path:
//
//	/pay            201 JSON echoing the run, fence and body, with headers
//	                that must and must not be stored
//	/status?code=N  N with a JSON body giving the run and fence
//	/panic          panics
//	/big?n=N        201 with N bytes of body and a Location
//	/hold           signals started, then waits for release
type testApp struct {
	runs    atomic.Int64
	started chan *http.Request
	release chan struct{}
}

func newTestApp() *testApp {
	return &testApp{started: make(chan *http.Request, 64), release: make(chan struct{})}
}

type echo struct {
	Run     int64  `json:"run"`
	Fence   int64  `json:"fence"`
	Key     string `json:"key"`
	Body    string `json:"body"`
	Attempt bool   `json:"attempt"`
}

func (a *testApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := a.runs.Add(1)
	at, ok := idem.AttemptFrom(r.Context())
	body, _ := io.ReadAll(r.Body)
	switch r.URL.Path {
	case "/panic":
		panic("boom")
	case "/status":
		code, _ := strconv.Atoi(r.URL.Query().Get("code"))
		w.WriteHeader(code)
		e := echo{Run: n, Attempt: ok}
		if ok {
			e.Fence = at.Fence
		}
		_ = json.NewEncoder(w).Encode(e)
		return
	case "/big":
		size, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Location", "/big/1")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(bytes.Repeat([]byte("x"), size))
		return
	case "/hold":
		a.started <- r
		<-a.release
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Location", fmt.Sprintf("/payments/%d", n))
	h.Set("Set-Cookie", "session=secret")
	h.Set("Authorization", "Bearer secret")
	h.Set("X-Run", strconv.FormatInt(n, 10))
	w.WriteHeader(http.StatusCreated)
	e := echo{Run: n, Body: string(body), Attempt: ok}
	if ok {
		e.Fence, e.Key = at.Fence, at.Key
	}
	_ = json.NewEncoder(w).Encode(e)
}

// req describes a request; key "" sends no key header.
type req struct {
	method, path, key, body, contentType string
	header                               http.Header
}

func (q req) build() *http.Request {
	method := q.method
	if method == "" {
		method = http.MethodPost
	}
	path := q.path
	if path == "" {
		path = "/pay"
	}
	r := httptest.NewRequest(method, path, strings.NewReader(q.body))
	if q.key != "" {
		r.Header.Set("Idempotency-Key", q.key)
	}
	if q.contentType != "" {
		r.Header.Set("Content-Type", q.contentType)
	}
	for k, vs := range q.header {
		r.Header[k] = vs
	}
	return r
}

func serve(h http.Handler, q req) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, q.build())
	return rec
}

type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// requireProblem checks an RFC 9457 problem response.
func requireProblem(t *testing.T, rec *httptest.ResponseRecorder, status int, slug string) problemBody {
	t.Helper()
	require.Equal(t, status, rec.Code, "body: %s", rec.Body)
	require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
	require.Empty(t, rec.Header().Get(idem.ReplayedHeader))
	var p problemBody
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p), "body: %s", rec.Body)
	require.Equal(t, problemBase+slug, p.Type)
	require.Equal(t, status, p.Status)
	require.NotEmpty(t, p.Title)
	require.NotEmpty(t, p.Detail)
	return p
}

func decodeEcho(t *testing.T, rec *httptest.ResponseRecorder) echo {
	t.Helper()
	var e echo
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &e), "body: %s", rec.Body)
	return e
}

// storeKeys counts the Redis keys under prefix.
func storeKeys(t *testing.T, c *redis.Client, prefix string) int {
	t.Helper()
	keys, err := c.Keys(context.Background(), prefix+":*").Result()
	require.NoError(t, err)
	return len(keys)
}

// failingStore fails the chosen methods with a transport-like error.
type failingStore struct {
	idemstore.Store
	claim, complete bool
}

var errDown = errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")

func (s *failingStore) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	if s.claim {
		return idemstore.ClaimResult{}, errDown
	}
	return s.Store.Claim(ctx, id, c)
}

func (s *failingStore) Complete(ctx context.Context, id, owner string, p []byte, r time.Duration) error {
	if s.complete {
		return errDown
	}
	return s.Store.Complete(ctx, id, owner, p, r)
}

// step is one request of a contract case and what must come back.
type step struct {
	req        req
	status     int
	problem    string            // problem type slug, for error answers
	replayed   bool              // Idempotent-Replayed: true
	header     map[string]string // exact values; "" means absent
	run, fence int64             // the echo's run and fence, for /pay answers
	runs       int64             // handler runs so far
	keys       int               // Redis keys under the case's prefix; -1: not checked
	panics     bool
}

func TestMiddlewareContract(t *testing.T) {
	const key = "8e03978e-40d5-43e8-bc93-6894a57f9324"
	body := `{"amount": 1000, "currency": "EUR"}`
	json := "application/json"
	first := step{req: req{key: key, body: body, contentType: json}, status: 201, run: 1, fence: 1, runs: 1, keys: -1,
		header: map[string]string{"Content-Type": "application/json", "Location": "/payments/1", "Set-Cookie": "session=secret", "X-Run": "1"}}
	replay := step{req: req{key: key, body: body, contentType: json}, status: 201, replayed: true, run: 1, fence: 1, runs: 1, keys: -1,
		header: map[string]string{"Content-Type": "application/json", "Location": "/payments/1", "Set-Cookie": "", "Authorization": "", "X-Run": ""}}
	with := func(s step, f func(*step)) step { f(&s); return s }

	cases := []struct {
		name  string
		opts  []idem.HTTPOption
		store func(idemstore.Store) idemstore.Store
		steps []step
	}{
		{name: "safe methods pass through, store untouched", steps: []step{
			{req: req{method: "GET", key: key}, status: 201, run: 1, runs: 1, keys: 0},
			{req: req{method: "HEAD"}, status: 201, runs: 2, keys: 0},
			{req: req{method: "OPTIONS", key: key}, status: 201, run: 3, runs: 3, keys: 0},
			{req: req{method: "TRACE"}, status: 201, run: 4, runs: 4, keys: 0},
		}},
		{name: "unconfigured methods pass through, store untouched", steps: []step{
			{req: req{method: "PUT", key: key}, status: 201, run: 1, runs: 1, keys: 0},
			{req: req{method: "DELETE"}, status: 201, run: 2, runs: 2, keys: 0},
		}},
		{name: "missing key", steps: []step{
			{req: req{body: body}, status: 400, problem: "key-missing", keys: 0},
			{req: req{method: "PATCH"}, status: 400, problem: "key-missing", keys: 0},
		}},
		{name: "invalid keys", steps: []step{
			{req: req{header: http.Header{"Idempotency-Key": {""}}}, status: 400, problem: "key-invalid", keys: 0},
			{req: req{key: strings.Repeat("k", 256)}, status: 400, problem: "key-invalid", keys: 0},
			{req: req{key: "caf\xc3\xa9"}, status: 400, problem: "key-invalid", keys: 0},
			{req: req{key: "tab\tkey"}, status: 400, problem: "key-invalid", keys: 0},
			{req: req{key: `"unterminated`}, status: 400, problem: "key-invalid", keys: 0},
			{req: req{key: `"a";p=1`}, status: 400, problem: "key-invalid", keys: 0},
			{req: req{key: `"bad\escape"`}, status: 400, problem: "key-invalid", keys: 0},
			{req: req{key: `""`}, status: 400, problem: "key-invalid", keys: 0},
			{req: req{header: http.Header{"Idempotency-Key": {"a", "b"}}}, status: 400, problem: "key-invalid", keys: 0},
		}},
		{name: "first request runs once, repeats replay", steps: []step{
			with(first, func(s *step) { s.keys = 1 }), // the record; completing dropped the lease
			replay,
			replay,
		}},
		{name: "a 255-byte key and an RFC 8941 string name the same operation", steps: []step{
			{req: req{key: strings.Repeat("k", 255)}, status: 201, run: 1, fence: 1, runs: 1, keys: -1},
			{req: req{key: `"` + strings.Repeat("k", 255) + `"`}, status: 201, replayed: true, run: 1, fence: 1, runs: 1, keys: -1},
			{req: req{key: `"q\"uo\\te"`}, status: 201, run: 2, fence: 1, runs: 2, keys: -1},
			{req: req{key: `q"uo\te`}, status: 201, replayed: true, run: 2, fence: 1, runs: 2, keys: -1},
		}},
		{name: "JSON bodies are compared canonically", steps: []step{
			first,
			with(replay, func(s *step) { s.req.body = "{\n  \"currency\":\"EUR\",\n  \"amount\":1000\n}" }),
			with(replay, func(s *step) { s.req.body = `{"currency":"\u0045UR","amount":1000}` }),
			with(replay, func(s *step) { s.req.contentType = "application/merchant+json; charset=utf-8" }),
		}},
		{name: "same key, different request", steps: []step{
			first,
			{req: req{key: key, body: `{"amount": 5000, "currency": "EUR"}`, contentType: json}, status: 422, problem: "key-reused", runs: 1, keys: -1},
			{req: req{key: key, body: `{"amount": 1000.0, "currency": "EUR"}`, contentType: json}, status: 422, problem: "key-reused", runs: 1, keys: -1},
			{req: req{key: key, body: body, contentType: "text/plain"}, status: 422, problem: "key-reused", runs: 1, keys: -1},
			{req: req{key: key, body: body, contentType: json, path: "/pay?x=1"}, status: 422, problem: "key-reused", runs: 1, keys: -1},
			{req: req{key: key, body: body, contentType: json, method: "PATCH"}, status: 422, problem: "key-reused", runs: 1, keys: -1},
			replay,
		}},
		{name: "non-JSON bodies are compared byte for byte", steps: []step{
			{req: req{key: key, body: "a=1&b=2", contentType: "application/x-www-form-urlencoded"}, status: 201, run: 1, fence: 1, runs: 1, keys: -1},
			{req: req{key: key, body: "b=2&a=1", contentType: "application/x-www-form-urlencoded"}, status: 422, problem: "key-reused", runs: 1, keys: -1},
			{req: req{key: key, body: "a=1&b=2", contentType: "application/x-www-form-urlencoded"}, status: 201, replayed: true, run: 1, fence: 1, runs: 1, keys: -1},
		}},
		{name: "scopes keep equal keys apart", opts: []idem.HTTPOption{idem.WithScope(func(r *http.Request) string { return r.Header.Get("X-Tenant") })}, steps: []step{
			{req: req{key: key, header: http.Header{"X-Tenant": {"a"}}}, status: 201, run: 1, fence: 1, runs: 1, keys: -1},
			{req: req{key: key, header: http.Header{"X-Tenant": {"b"}}}, status: 201, run: 2, fence: 1, runs: 2, keys: -1},
			{req: req{key: key, header: http.Header{"X-Tenant": {"a"}}}, status: 201, replayed: true, run: 1, fence: 1, runs: 2, keys: -1},
		}},
		{name: "store unreachable: 503, handler not run", store: func(s idemstore.Store) idemstore.Store { return &failingStore{Store: s, claim: true} }, steps: []step{
			{req: req{key: key}, status: 503, problem: "store-unavailable", header: map[string]string{"Retry-After": "1"}, keys: 0},
			{req: req{method: "GET"}, status: 201, run: 1, runs: 1, keys: 0},
		}},
		{name: "not recorded: the handler's own response, no replay header", store: func(s idemstore.Store) idemstore.Store { return &failingStore{Store: s, complete: true} }, steps: []step{
			with(first, func(s *step) { s.header = map[string]string{"X-Run": "1", idem.ReplayedHeader: ""} }),
		}},
		{name: "5xx, 408, 409, 425, 429 are not stored: a retry runs again with Fence+1", steps: []step{
			{req: req{key: key, path: "/status?code=500"}, status: 500, run: 1, fence: 1, runs: 1, keys: -1},
			{req: req{key: key, path: "/status?code=500"}, status: 500, run: 2, fence: 2, runs: 2, keys: -1},
			{req: req{key: "k408", path: "/status?code=408"}, status: 408, run: 3, fence: 1, runs: 3, keys: -1},
			{req: req{key: "k408", path: "/status?code=408"}, status: 408, run: 4, fence: 2, runs: 4, keys: -1},
			{req: req{key: "k409", path: "/status?code=409"}, status: 409, run: 5, fence: 1, runs: 5, keys: -1},
			{req: req{key: "k409", path: "/status?code=409"}, status: 409, run: 6, fence: 2, runs: 6, keys: -1},
			{req: req{key: "k425", path: "/status?code=425"}, status: 425, run: 7, fence: 1, runs: 7, keys: -1},
			{req: req{key: "k425", path: "/status?code=425"}, status: 425, run: 8, fence: 2, runs: 8, keys: -1},
			{req: req{key: "k429", path: "/status?code=429"}, status: 429, run: 9, fence: 1, runs: 9, keys: -1},
			{req: req{key: "k429", path: "/status?code=429"}, status: 429, run: 10, fence: 2, runs: 10, keys: -1},
			{req: req{key: "k503", path: "/status?code=503"}, status: 503, run: 11, fence: 1, runs: 11, keys: -1},
			{req: req{key: "k503", path: "/status?code=503"}, status: 503, run: 12, fence: 2, runs: 12, keys: -1},
			{req: req{key: "k503", path: "/status?code=503"}, status: 503, run: 13, fence: 3, runs: 13, keys: -1},
		}},
		{name: "other statuses are stored, including 4xx", steps: []step{
			{req: req{key: key, path: "/status?code=400"}, status: 400, run: 1, fence: 1, runs: 1, keys: -1},
			{req: req{key: key, path: "/status?code=400"}, status: 400, replayed: true, run: 1, fence: 1, runs: 1, keys: -1},
			{req: req{key: "k204", path: "/status?code=204"}, status: 204, runs: 2, keys: -1},
			{req: req{key: "k204", path: "/status?code=204"}, status: 204, replayed: true, runs: 2, keys: -1},
			{req: req{key: "k202", path: "/status?code=202"}, status: 202, run: 3, fence: 1, runs: 3, keys: -1},
			{req: req{key: "k202", path: "/status?code=202"}, status: 202, replayed: true, run: 3, fence: 1, runs: 3, keys: -1},
		}},
		{name: "panic releases and continues", steps: []step{
			{req: req{key: key, path: "/panic"}, panics: true, runs: 1, keys: -1},
			{req: req{key: key, path: "/panic"}, panics: true, runs: 2, keys: -1},
		}},
		{name: "body too large: 413, handler not run", opts: []idem.HTTPOption{idem.WithMaxRequestBody(8)}, steps: []step{
			{req: req{key: key, body: "123456789"}, status: 413, problem: "body-too-large", keys: 0},
			{req: req{key: key, body: "12345678"}, status: 201, run: 1, fence: 1, runs: 1, keys: -1},
		}},
		{name: "optional key", opts: []idem.HTTPOption{idem.WithOptionalKey()}, steps: []step{
			{req: req{body: body}, status: 201, run: 1, runs: 1, keys: 0},
			{req: req{key: "caf\xc3\xa9"}, status: 400, problem: "key-invalid", runs: 1, keys: 0},
			{req: req{key: key}, status: 201, run: 2, fence: 1, runs: 2, keys: -1},
			{req: req{key: key}, status: 201, replayed: true, run: 2, fence: 1, runs: 2, keys: -1},
		}},
		{name: "options: methods, header name, stored headers, cache status", opts: []idem.HTTPOption{
			idem.WithMethods("PUT"), idem.WithKeyHeader("x-request-key"), idem.WithStoredHeaders("X-Run"),
			idem.WithCacheStatus(func(code int) bool { return code == 201 }),
		}, steps: []step{
			{req: req{method: "POST"}, status: 201, run: 1, runs: 1, keys: 0},
			{req: req{method: "PUT"}, status: 400, problem: "key-missing", runs: 1, keys: 0},
			{req: req{method: "PUT", header: http.Header{"X-Request-Key": {key}}}, status: 201, run: 2, fence: 1, runs: 2, keys: -1},
			{req: req{method: "PUT", header: http.Header{"X-Request-Key": {key}}}, status: 201, replayed: true, run: 2, fence: 1, runs: 2, keys: -1,
				header: map[string]string{"X-Run": "2", "Location": "/payments/2", "Set-Cookie": ""}},
			{req: req{method: "PUT", path: "/status?code=400", header: http.Header{"X-Request-Key": {"k2"}}}, status: 400, runs: 3, keys: -1},
			{req: req{method: "PUT", path: "/status?code=400", header: http.Header{"X-Request-Key": {"k2"}}}, status: 400, runs: 4, keys: -1},
		}},
	}
	forEachBackend(t, func(t *testing.T, b *backend) {
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				prefix := fmt.Sprintf("%s-%d", b.prefix, i)
				var store idemstore.Store = idem.NewRedisStore(b.client, idem.WithPrefix(prefix))
				if tc.store != nil {
					store = tc.store(store)
				}
				app := newTestApp()
				h := idem.New(store, quiet).Middleware(tc.opts...)(app)
				for n, s := range tc.steps {
					t.Logf("step %d: %s %s key=%q", n, s.req.method, s.req.path, s.req.key)
					if s.panics {
						require.PanicsWithValue(t, "boom", func() { serve(h, s.req) })
						require.Equal(t, s.runs, app.runs.Load())
						continue
					}
					rec := serve(h, s.req)
					t.Logf("-> %d %v %s", rec.Code, rec.Header(), rec.Body)
					require.Equal(t, s.status, rec.Code, "step %d, body: %s", n, rec.Body)
					if s.problem != "" {
						requireProblem(t, rec, s.status, s.problem)
					} else if s.replayed {
						require.Equal(t, "true", rec.Header().Get(idem.ReplayedHeader), "step %d", n)
					} else {
						require.Empty(t, rec.Header().Values(idem.ReplayedHeader), "step %d", n)
					}
					for k, v := range s.header {
						require.Equal(t, v, rec.Header().Get(k), "step %d, header %s", n, k)
					}
					if s.run != 0 {
						e := decodeEcho(t, rec)
						require.Equal(t, s.run, e.Run, "step %d: the run that produced the body", n)
						require.Equal(t, s.fence, e.Fence, "step %d", n)
					}
					require.Equal(t, s.runs, app.runs.Load(), "step %d: handler runs", n)
					if s.keys >= 0 {
						require.Equal(t, s.keys, storeKeys(t, b.client, prefix), "step %d: Redis keys", n)
					}
				}
			})
		}
	})
}

// post sends a POST with key to url and returns the status, the replay
// header and the body.
type answer struct {
	status   int
	replayed bool
	retry    string
	body     []byte
	err      error
}

func post(client *http.Client, url, key, body string) answer {
	r, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(r)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, replayed: resp.Header.Get(idem.ReplayedHeader) == "true", retry: resp.Header.Get("Retry-After"), body: b, err: err}
}

// stampede sends n concurrent duplicates, spread over urls, to an app whose
// handler holds until the test releases it. It releases the handler once the
// n-1 others have been answered (each must be a 409 with Retry-After), then
// checks that the one in the handler gets 201, that later duplicates get the
// replay on every url, and that the handler ran once.
func stampede(t *testing.T, app *testApp, urls []string, n int) {
	t.Helper()
	answers := make(chan answer, n)
	for i := range n {
		go func() { answers <- post(http.DefaultClient, urls[i%len(urls)]+"/hold", "stampede", `{"n":1}`) }()
	}
	timeout := time.After(20 * time.Second)
	for range n - 1 {
		select {
		case a := <-answers:
			require.NoError(t, a.err)
			require.Equal(t, http.StatusConflict, a.status, "a duplicate while the first runs: %s", a.body)
			require.NotEmpty(t, a.retry)
		case <-timeout:
			t.Fatal("duplicates were not answered while the first request ran")
		}
	}
	close(app.release)
	var first answer
	select {
	case first = <-answers:
	case <-timeout:
		t.Fatal("the first request was not answered")
	}
	require.NoError(t, first.err)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	require.False(t, first.replayed)

	for i := range n {
		go func() { answers <- post(http.DefaultClient, urls[i%len(urls)]+"/hold", "stampede", `{"n":1}`) }()
	}
	for range n {
		a := <-answers
		require.NoError(t, a.err)
		require.Equal(t, http.StatusCreated, a.status)
		require.True(t, a.replayed)
		require.Equal(t, first.body, a.body)
	}
	require.EqualValues(t, 1, app.runs.Load(), "one execution")
}

func TestMiddlewareConcurrentDuplicates(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		app := newTestApp()
		srv := httptest.NewServer(b.guard(t).Middleware()(app))
		t.Cleanup(srv.Close)
		stampede(t, app, []string{srv.URL}, 32)
	})
}

func TestMiddlewareReplicasShareOneRedis(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		app := newTestApp()
		var urls []string
		for range 3 {
			c := redis.NewClient(&redis.Options{Addr: b.client.Options().Addr}) // each replica its own pool
			t.Cleanup(func() { c.Close() })
			g := idem.New(idem.NewRedisStore(c, idem.WithPrefix(b.prefix)), quiet)
			srv := httptest.NewServer(g.Middleware()(app))
			t.Cleanup(srv.Close)
			urls = append(urls, srv.URL)
		}
		stampede(t, app, urls, 30)
	})
}

func TestMiddlewareInProgress(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		app := newTestApp()
		h := b.guard(t, idem.WithLease(5*time.Second)).Middleware()(app)
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- serve(h, req{key: "k", path: "/hold"}) }()
		<-app.started

		rec := serve(h, req{key: "k", path: "/hold"})
		requireProblem(t, rec, http.StatusConflict, "in-progress")
		secs, err := strconv.Atoi(rec.Header().Get("Retry-After"))
		require.NoError(t, err, "Retry-After is whole seconds")
		require.Equal(t, 1, secs, "Retry-After is a poll hint (WithRetryAfter, default 1s), not the remaining lease")

		rec = serve(h, req{key: "k", path: "/hold", body: "other"})
		requireProblem(t, rec, http.StatusUnprocessableEntity, "key-reused")

		close(app.release)
		require.Equal(t, http.StatusCreated, (<-done).Code)
		rec = serve(h, req{key: "k", path: "/hold"})
		require.Equal(t, http.StatusCreated, rec.Code)
		require.Equal(t, "true", rec.Header().Get(idem.ReplayedHeader))
		require.EqualValues(t, 1, app.runs.Load())
	})
}

// busyStore reports every claim that found the key busy.
type busyStore struct {
	idemstore.Store
	busy chan struct{}
}

func (s *busyStore) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, id, c)
	if res.Status == idemstore.ClaimBusy {
		select {
		case s.busy <- struct{}{}:
		default:
		}
	}
	return res, err
}

func TestMiddlewareWaitGetsTheFirstResponse(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		app := newTestApp()
		store := &busyStore{Store: b.store(), busy: make(chan struct{}, 1)}
		h := idem.New(store, quiet, idem.WithWait(20*time.Second)).Middleware()(app)
		first := make(chan *httptest.ResponseRecorder)
		go func() { first <- serve(h, req{key: "k", path: "/hold"}) }()
		<-app.started
		second := make(chan *httptest.ResponseRecorder)
		go func() { second <- serve(h, req{key: "k", path: "/hold"}) }()
		<-store.busy // the duplicate found the key busy and waits
		close(app.release)

		a, r := <-first, <-second
		require.Equal(t, http.StatusCreated, a.Code)
		require.Empty(t, a.Header().Get(idem.ReplayedHeader))
		require.Equal(t, http.StatusCreated, r.Code)
		require.Equal(t, "true", r.Header().Get(idem.ReplayedHeader))
		require.Equal(t, a.Body.String(), r.Body.String())
		require.EqualValues(t, 1, app.runs.Load())
	})
}

// TestMiddlewareWaiterStopsWhenItsClientLeaves: a duplicate waiting under
// WithWait gives up when its own client goes away; the first request is not
// disturbed.
func TestMiddlewareWaiterStopsWhenItsClientLeaves(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		app := newTestApp()
		store := &busyStore{Store: b.store(), busy: make(chan struct{}, 1)}
		h := idem.New(store, quiet, idem.WithWait(time.Minute)).Middleware()(app)
		first := make(chan *httptest.ResponseRecorder)
		go func() { first <- serve(h, req{key: "k", path: "/hold"}) }()
		<-app.started
		ctx, leave := context.WithCancel(context.Background())
		second := make(chan struct{})
		go func() {
			defer close(second)
			h.ServeHTTP(httptest.NewRecorder(), req{key: "k", path: "/hold"}.build().WithContext(ctx))
		}()
		<-store.busy // the duplicate waits
		leave()
		select {
		case <-second:
		case <-time.After(10 * time.Second):
			t.Fatal("the waiting duplicate did not stop when its client left")
		}
		close(app.release)
		require.Equal(t, http.StatusCreated, (<-first).Code)
		require.EqualValues(t, 1, app.runs.Load())
	})
}

// TestMiddlewareLostAnswer: the server processes a request and commits it,
// but the connection drops before the answer; the transport retries with the
// same key and gets the stored answer.
func TestMiddlewareLostAnswer(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		app := newTestApp()
		h := b.guard(t).Middleware()(app)
		var (
			mu   sync.Mutex
			keys []string
		)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			keys = append(keys, r.Header.Get("Idempotency-Key"))
			n := len(keys)
			mu.Unlock()
			if n == 1 {
				h.ServeHTTP(httptest.NewRecorder(), r) // processed and recorded...
				panic(http.ErrAbortHandler)            // ...but the answer is lost
			}
			h.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)

		client := &http.Client{Transport: idemclient.NewTransport(nil, idemclient.WithBackoff(time.Millisecond, time.Millisecond))}
		resp, err := client.Post(srv.URL+"/pay", "application/json", strings.NewReader(`{"amount":1000}`))
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)

		require.Equal(t, http.StatusCreated, resp.StatusCode)
		require.Equal(t, "true", resp.Header.Get(idem.ReplayedHeader))
		require.Contains(t, string(body), `"run":1`)
		require.EqualValues(t, 1, app.runs.Load(), "one execution")
		require.Len(t, keys, 2)
		require.Equal(t, keys[0], keys[1], "the retry carries the same key")
		require.Regexp(t, `^"[0-9a-f-]{36}"$`, keys[0], "a UUID sent as an RFC 8941 string")
	})
}

// TestMiddlewareClientDisconnect: a client that goes away while its request
// runs cancels neither the handler nor the record; its retry gets the replay.
func TestMiddlewareClientDisconnect(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		app := newTestApp()
		h := b.guard(t).Middleware()(app)
		outer := make(chan context.Context, 1)
		served := make(chan struct{}) // closed when the first request's middleware returned
		var first atomic.Bool
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if first.CompareAndSwap(false, true) {
				outer <- r.Context()
				defer close(served)
			}
			h.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)

		ctx, cancel := context.WithCancel(context.Background())
		r, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/hold", strings.NewReader("x"))
		require.NoError(t, err)
		r.Header.Set("Idempotency-Key", "gone")
		errc := make(chan error, 1)
		go func() {
			resp, err := http.DefaultClient.Do(r)
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		inner := <-app.started
		cancel()
		require.Error(t, <-errc)
		<-(<-outer).Done() // the server saw the client go
		require.NoError(t, inner.Context().Err(), "the handler's context is detached from the client")
		close(app.release)

		// The middleware returns once it stored the answer; the retry
		// then gets the replay.
		<-served
		a := post(http.DefaultClient, srv.URL+"/hold", "gone", "x")
		require.NoError(t, a.err)
		require.Equal(t, http.StatusCreated, a.status, "%s", a.body)
		require.True(t, a.replayed)
		require.EqualValues(t, 1, app.runs.Load())
	})
}

// TestMiddlewareLongHandlerKeepsLease: a handler that runs several leases
// long keeps its key (heartbeat); duplicates meanwhile get 409.
func TestMiddlewareLongHandlerKeepsLease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		const lease = 300 * time.Millisecond
		app := newTestApp()
		h := b.guard(t, idem.WithLease(lease)).Middleware()(app)
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- serve(h, req{key: "long", path: "/hold"}) }()
		<-app.started
		for end := time.Now().Add(3 * lease); time.Now().Before(end); time.Sleep(lease / 5) {
			if b.mr != nil {
				b.mr.FastForward(lease / 5) // miniredis' clock moves only when told
			}
			rec := serve(h, req{key: "long", path: "/hold"})
			requireProblem(t, rec, http.StatusConflict, "in-progress")
		}
		close(app.release)
		require.Equal(t, http.StatusCreated, (<-done).Code)
		rec := serve(h, req{key: "long", path: "/hold"})
		require.Equal(t, "true", rec.Header().Get(idem.ReplayedHeader))
		require.EqualValues(t, 1, app.runs.Load())
	})
}

// TestMiddlewareRedisDown runs against a real redis-server that is killed
// and restarted.
func TestMiddlewareRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	app := newTestApp()
	h := idem.New(idem.NewRedisStore(c), quiet).Middleware()(app)

	require.Equal(t, http.StatusCreated, serve(h, req{key: "before"}).Code)
	srv.Kill(t)
	rec := serve(h, req{key: "during"})
	requireProblem(t, rec, http.StatusServiceUnavailable, "store-unavailable")
	require.Equal(t, "1", rec.Header().Get("Retry-After"))
	require.EqualValues(t, 1, app.runs.Load(), "fail closed: the handler did not run")
	require.Equal(t, http.StatusCreated, serve(h, req{method: "GET"}).Code, "safe methods do not need Redis")

	srv.Restart(t)
	require.Equal(t, http.StatusCreated, serve(h, req{key: "during"}).Code)
	require.EqualValues(t, 3, app.runs.Load())
}

func TestMiddlewareNotRecordedIsLogged(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		log, logged := recordingLogger()
		app := newTestApp()
		g := idem.New(&failingStore{Store: b.store(), complete: true}, idem.WithLogger(log), idem.WithLease(200*time.Millisecond))
		rec := serve(g.Middleware()(app), req{key: "k"})
		require.Equal(t, http.StatusCreated, rec.Code)
		require.Empty(t, rec.Header().Values(idem.ReplayedHeader))
		require.Contains(t, logged(), "event=result_pending")
		require.NoError(t, g.Drain(t.Context())) // tried until the lease ends
		require.Contains(t, logged(), "level=ERROR")
		require.Contains(t, logged(), "not recorded")
	})
}

// spyWriter records whether anything reached the client.
type spyWriter struct {
	*httptest.ResponseRecorder
	wrote atomic.Bool
}

func (s *spyWriter) WriteHeader(code int) {
	s.wrote.Store(true)
	s.ResponseRecorder.WriteHeader(code)
}

func (s *spyWriter) Write(p []byte) (int, error) {
	s.wrote.Store(true)
	return s.ResponseRecorder.Write(p)
}

type completeHook struct {
	idemstore.Store
	hook func()
}

func (s *completeHook) Complete(ctx context.Context, id, owner string, p []byte, r time.Duration) error {
	s.hook()
	return s.Store.Complete(ctx, id, owner, p, r)
}

func TestMiddlewareHoldsResponseUntilCommitted(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		w := &spyWriter{ResponseRecorder: httptest.NewRecorder()}
		var early atomic.Bool
		store := &completeHook{Store: b.store(), hook: func() { early.Store(w.wrote.Load()) }}
		h := idem.New(store, quiet).Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusAccepted)
			_, _ = io.WriteString(w, "queued")
			http.NewResponseController(w).Flush() // held anyway
			w.Header().Set("X-Late", "1")         // after the first write: not part of the response
		}))
		h.ServeHTTP(w, req{key: "k"}.build())
		require.False(t, early.Load(), "nothing reached the client before the record was committed")
		require.Equal(t, http.StatusAccepted, w.Code)
		require.Equal(t, "queued", w.Body.String())
		require.Empty(t, w.Header().Get("X-Late"))

		rec := serve(h, req{key: "k"})
		require.Equal(t, http.StatusAccepted, rec.Code)
		require.Equal(t, "queued", rec.Body.String())
		require.Equal(t, "text/plain", rec.Header().Get("Content-Type"))
	})
}

func TestMiddlewareRecorderRules(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t)
		cases := []struct {
			name    string
			handler http.HandlerFunc
			status  int
			body    string
			header  map[string]string
		}{
			{"implicit 200 on Write", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "hi") }, 200, "hi", nil},
			{"implicit 200 when nothing is written", func(w http.ResponseWriter, r *http.Request) { w.Header().Set("Location", "/x") }, 200, "", map[string]string{"Location": "/x"}},
			{"first WriteHeader wins", func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(201)
				w.WriteHeader(400)
				_, _ = io.WriteString(w, "a")
			}, 201, "a", nil},
			{"informational statuses are dropped", func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(103)
				w.WriteHeader(202)
			}, 202, "", nil},
			{"headers are snapshotted at the first write", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", "/a")
				_, _ = io.WriteString(w, "a")
				w.Header().Set("Location", "/b")
				w.Header().Set("Etag", `"late"`)
			}, 200, "a", map[string]string{"Location": "/a", "Etag": ""}},
			{"no body on 204", func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(204)
				_, err := io.WriteString(w, "x")
				if !errors.Is(err, http.ErrBodyNotAllowed) {
					panic(err)
				}
			}, 204, "", nil},
			{"hijack is refused", func(w http.ResponseWriter, r *http.Request) {
				_, _, err := http.NewResponseController(w).Hijack()
				if err == nil {
					panic("hijacked")
				}
				w.WriteHeader(201)
			}, 201, "", nil},
			{"multiple header values", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Add("Content-Location", "/a")
				w.Header().Add("Content-Location", "/b")
			}, 200, "", map[string]string{"Content-Location": "/a"}},
			{"Flush commits 200, as net/http's does", func(w http.ResponseWriter, r *http.Request) {
				_ = http.NewResponseController(w).Flush()
				w.WriteHeader(201)
				_, _ = io.WriteString(w, "a")
			}, 200, "a", nil},
			{"http.Flusher's Flush too", func(w http.ResponseWriter, r *http.Request) {
				w.(http.Flusher).Flush()
				w.WriteHeader(201)
				_, _ = io.WriteString(w, "a")
			}, 200, "a", nil},
			{"100 Continue is dropped too", func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(100)
				w.WriteHeader(201)
			}, 201, "", nil},
		}
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				h := g.Middleware()(tc.handler)
				key := fmt.Sprintf("rule-%d", i)
				var firstHeader http.Header
				for _, replay := range []bool{false, true} {
					rec := serve(h, req{key: key})
					require.Equal(t, tc.status, rec.Code)
					require.Equal(t, tc.body, rec.Body.String())
					for k, v := range tc.header {
						require.Equal(t, v, rec.Header().Get(k), k)
					}
					if !replay {
						firstHeader = rec.Header()
						continue
					}
					require.Equal(t, "true", rec.Header().Get(idem.ReplayedHeader))
					require.NotContains(t, rec.Header(), "", "a header without a name")
					for _, k := range []string{"Content-Type", "Location", "Content-Location", "Etag"} {
						require.Equal(t, firstHeader.Values(k), rec.Header().Values(k), k)
					}
				}
			})
		}
	})
}

func TestMiddlewareResponseController(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		errs := make(chan error, 2)
		srv := httptest.NewServer(b.guard(t).Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rc := http.NewResponseController(w)
			errs <- rc.SetWriteDeadline(time.Now().Add(time.Minute))
			w.WriteHeader(http.StatusCreated)
			errs <- rc.Flush()
		})))
		t.Cleanup(srv.Close)
		a := post(http.DefaultClient, srv.URL, "rc", "")
		require.NoError(t, a.err)
		require.Equal(t, http.StatusCreated, a.status)
		require.NoError(t, <-errs, "deadlines reach the connection through Unwrap")
		require.NoError(t, <-errs)
	})
}

func TestMiddlewareOptionsRejectedAtConstruction(t *testing.T) {
	g := idem.New(nil)
	for name, opt := range map[string]idem.HTTPOption{
		"safe method":               idem.WithMethods("POST", "GET"),
		"no method":                 idem.WithMethods(),
		"Set-Cookie stored":         idem.WithStoredHeaders("set-cookie"),
		"Authorization stored":      idem.WithStoredHeaders("Authorization"),
		"empty header":              idem.WithKeyHeader(""),
		"nil scope":                 idem.WithScope(nil),
		"nil cache status":          idem.WithCacheStatus(nil),
		"zero request limit":        idem.WithMaxRequestBody(0),
		"negative response limit":   idem.WithMaxResponseBody(-1),
		"header name with a colon":  idem.WithKeyHeader("Key:"),
		"safe method in lower case": idem.WithMethods("get"),
		"method not a token":        idem.WithMethods("PO ST"),
		"zero Retry-After":          idem.WithRetryAfter(0),
		"negative route wait":       idem.WithRouteWait(-1),
	} {
		require.Panics(t, func() { g.Middleware(opt) }, name)
	}
	require.Panics(t, func() { (*idem.Guard)(nil).Middleware() })
	require.Panics(t, func() { g.Middleware()(nil) })
	require.NotPanics(t, func() { g.Middleware(idem.WithMethods("PUT", "DELETE"), idem.WithStoredHeaders("X-Request-Id")) })

	_, ok := idem.AttemptFrom(context.Background())
	require.False(t, ok)
}

// A nil store fails closed like an unreachable one.
func TestMiddlewareNilStore(t *testing.T) {
	app := newTestApp()
	rec := serve(idem.New(nil, quiet).Middleware()(app), req{key: "k"})
	requireProblem(t, rec, http.StatusServiceUnavailable, "store-unavailable")
	require.Zero(t, app.runs.Load())
}

func FuzzMiddleware(f *testing.F) {
	f.Add("POST", "/pay", "8e03978e-40d5-43e8-bc93-6894a57f9324", "application/json", []byte(`{"amount":1}`), false)
	f.Add("POST", "/pay?x=1", `"quoted"`, "application/json", []byte(`{"b":[1,2,{"a":"\u00e9"}],"a":null}`), false)
	f.Add("PATCH", "/", "", "", []byte(nil), false)
	f.Add("POST", "/", `"\`, "text/plain", []byte("x"), false)
	f.Add("POST", "/", "k\x00", "application/json", []byte(`{"a":`), false)
	f.Add("GET", "/", "k", "", []byte("body"), true)
	f.Add("POST", "/status", "k", "application/problem+json", []byte(`[[[[[]]]]]`), true)
	f.Add("DELETE", "/panic", "k", "", []byte{0xff, 0xfe}, false)
	f.Add("post", "/%zz", strings.Repeat("k", 300), "application/json; charset=utf-8", []byte(`"\ud800"`), false)
	// Hostile bodies: repeated member names, names equal but for case, deep
	// nesting out of order, and a method in lower case.
	f.Add("POST", "/pay", "dup", "application/json", []byte(`{"amount":1,"amount":1000}`), false)
	f.Add("post", "/pay", "fold", "application/json", []byte(`{"amount":1,"Amount":1000,"\u212a":0}`), false)
	f.Add("PATCH", "/pay", "deep", "application/json", []byte(strings.Repeat(`{"z":0,"a":`, 300)+"1"+strings.Repeat("}", 300)), false)
	f.Add("POST", "/pay", "deep2", "application/json", []byte(strings.Repeat(`[{"b":1,"a":`, 200)+"[]"+strings.Repeat("}]", 200)), false)

	c := redis.NewClient(&redis.Options{Addr: miniredis.RunT(f).Addr()})
	f.Cleanup(func() { c.Close() })
	var runs atomic.Int64
	echoHandler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", r.Header.Get("Content-Type"))
		_, _ = w.Write(b)
	})
	up := idem.New(idem.NewRedisStore(c), quiet).Middleware(idem.WithMaxRequestBody(1 << 12))(echoHandler)
	down := idem.New(&failingStore{Store: idem.NewRedisStore(c), claim: true}, quiet).Middleware()(echoHandler)

	f.Fuzz(func(t *testing.T, method, target, key, contentType string, body []byte, storeDown bool) {
		u, err := url.Parse(target)
		if err != nil {
			u = &url.URL{Path: "/"}
		}
		r := &http.Request{Method: method, URL: u, Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(body)), ContentLength: -1}
		r = r.WithContext(context.Background())
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		if contentType != "" {
			r.Header.Set("Content-Type", contentType)
		}
		h := up
		if storeDown {
			h = down
		}
		before := runs.Load()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		switch {
		case rec.Code == http.StatusServiceUnavailable && storeDown:
			require.Equal(t, before, runs.Load(), "fail closed")
		case rec.Code >= 500:
			t.Fatalf("%s %q key %q: %d %s", method, target, key, rec.Code, rec.Body)
		}
		if rec.Header().Get(idem.ReplayedHeader) == "" && rec.Code < 300 && runs.Load() == before {
			t.Fatalf("a success that is neither a replay nor a run: %d", rec.Code)
		}
	})
}
