package main

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/gateway"
	"github.com/idemkit/idem/internal/redistest"
)

// proxyArgs returns the flags that point a proxy at upstream and at the
// shared Redis, under a prefix of the test's own.
func proxyArgs(t *testing.T, upstream string, more ...string) []string {
	srv := redistest.Shared(t)
	return append([]string{"-upstream", upstream, "-redis", "redis://" + srv.Addr(), "-prefix", redistest.Prefix(t)}, more...)
}

// TestProxyConcurrentDuplicates: 32 concurrent requests with one key run
// the upstream once, and every one gets the same answer.
func TestProxyConcurrentDuplicates(t *testing.T) {
	release := make(chan struct{})
	u := newCounting(t, func(w http.ResponseWriter, r *http.Request, run int32) {
		<-release
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"run":` + itoa(run) + `}`))
	})
	p := startProxy(t, proxyArgs(t, u.srv.URL, "-wait", "20s")...)
	const n = 32
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			answers[i] = send(t, http.MethodPost, p.url+"/orders", `{"item":"book"}`, "Idempotency-Key", "dup-1")
		})
	}
	require.Eventually(t, func() bool { return u.runs.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	time.Sleep(50 * time.Millisecond) // let the duplicates reach their wait; they must not run meanwhile
	close(release)
	wg.Wait()
	require.EqualValues(t, 1, u.runs.Load(), "one upstream execution")
	replayed := 0
	for _, a := range answers {
		require.Equal(t, http.StatusCreated, a.status, a.body)
		require.Equal(t, `{"run":1}`, a.body)
		if a.header.Get("Idempotent-Replayed") == "true" {
			replayed++
		}
	}
	require.Equal(t, n-1, replayed, "every answer but the first is the stored one")
}

// TestProxyContract: the attempt header, replays, 422, and what passes
// through.
func TestProxyContract(t *testing.T) {
	u := newCounting(t, nil)
	p := startProxy(t, proxyArgs(t, u.srv.URL)...)

	a := send(t, http.MethodPost, p.url+"/orders", `{"item":"book"}`, "Idempotency-Key", "k1", gateway.AttemptHeader, "9")
	require.Equal(t, http.StatusCreated, a.status)
	require.Empty(t, a.header.Get("Idempotent-Replayed"))
	seen := u.requests()
	require.Len(t, seen, 1)
	require.Equal(t, "k1", seen[0].key, "the upstream gets the key unchanged")
	require.Equal(t, "1", seen[0].attempt, "the upstream gets the attempt's fence, never the client's value")

	b := send(t, http.MethodPost, p.url+"/orders", `{ "item": "book" }`, "Idempotency-Key", "k1")
	require.Equal(t, http.StatusCreated, b.status)
	require.Equal(t, "true", b.header.Get("Idempotent-Replayed"))
	require.Equal(t, a.body, b.body)
	require.Equal(t, a.header.Get("Location"), b.header.Get("Location"))

	c := send(t, http.MethodPost, p.url+"/orders", `{"item":"pen"}`, "Idempotency-Key", "k1")
	require.Equal(t, http.StatusUnprocessableEntity, c.status)
	require.Contains(t, problemType(t, c), "#key-reused")
	require.EqualValues(t, 1, u.runs.Load())

	// No key, other methods: through, every time, without an attempt header.
	for range 2 {
		require.Equal(t, http.StatusCreated, send(t, http.MethodPost, p.url+"/orders", `{}`, gateway.AttemptHeader, "3").status)
		require.Equal(t, http.StatusCreated, send(t, http.MethodPut, p.url+"/orders/1", `{}`, "Idempotency-Key", "k1").status)
		require.Equal(t, http.StatusCreated, send(t, http.MethodGet, p.url+"/orders/1", "").status)
	}
	require.EqualValues(t, 7, u.runs.Load())
	for _, s := range u.requests()[1:] {
		require.Empty(t, s.attempt, "a passed-through request carries no attempt header")
	}

	// One log line per request, with the decision.
	p.logs.await(t, map[string]any{"msg": "request", "outcome": "executed", "status": float64(201)})
	p.logs.await(t, map[string]any{"msg": "request", "outcome": "replayed"})
	p.logs.await(t, map[string]any{"msg": "request", "outcome": "mismatch", "status": float64(422)})
	p.logs.await(t, map[string]any{"msg": "request", "outcome": "pass", "method": "GET"})
	// Without -scope-header, the start says that all clients share one key space.
	p.logs.await(t, map[string]any{"event": "unscoped", "level": "WARN"})
	require.Equal(t, exitOK, p.stop())
}

// TestProxyRequireKey: with -require-key, a POST without a key is 400 and
// does not reach the upstream.
func TestProxyRequireKey(t *testing.T) {
	u := newCounting(t, nil)
	p := startProxy(t, proxyArgs(t, u.srv.URL, "-require-key", "-methods", "POST")...)
	a := send(t, http.MethodPost, p.url+"/orders", `{}`)
	require.Equal(t, http.StatusBadRequest, a.status)
	require.Contains(t, problemType(t, a), "#key-missing")
	require.Equal(t, http.StatusCreated, send(t, http.MethodPatch, p.url+"/orders/1", `{}`).status, "PATCH is not configured")
	require.EqualValues(t, 1, u.runs.Load())
}

// TestProxyScopes: with -scope-header, equal keys of two accounts are two
// operations, and a keyed request without the header is refused.
func TestProxyScopes(t *testing.T) {
	u := newCounting(t, nil)
	p := startProxy(t, proxyArgs(t, u.srv.URL, "-scope-header", "X-Account")...)
	require.Nil(t, p.logs.find(map[string]any{"event": "unscoped"}))
	a := send(t, http.MethodPost, p.url+"/orders", `{}`, "Idempotency-Key", "k1", "X-Account", "acct-a")
	b := send(t, http.MethodPost, p.url+"/orders", `{}`, "Idempotency-Key", "k1", "X-Account", "acct-b")
	require.Equal(t, http.StatusCreated, a.status)
	require.Equal(t, http.StatusCreated, b.status)
	require.Empty(t, b.header.Get("Idempotent-Replayed"), "another account's key is another operation")
	require.NotEqual(t, a.body, b.body)
	r := send(t, http.MethodPost, p.url+"/orders", `{}`, "Idempotency-Key", "k1", "X-Account", "acct-a")
	require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	require.Equal(t, a.body, r.body)
	require.EqualValues(t, 2, u.runs.Load())

	for _, h := range [][]string{{"Idempotency-Key", "k1"}, {"Idempotency-Key", "k1", "X-Account", "acct-a", "X-Account", "acct-b"}} {
		m := send(t, http.MethodPost, p.url+"/orders", `{}`, h...)
		require.Equal(t, http.StatusInternalServerError, m.status, "a keyed request without exactly one scope is refused")
		require.Contains(t, problemType(t, m), "#scope-missing")
	}
	require.EqualValues(t, 2, u.runs.Load())
	require.Equal(t, http.StatusCreated, send(t, http.MethodPost, p.url+"/orders", `{}`).status, "an unkeyed request passes through")
}

// TestProxyKeyFromJSON: -key-json takes the key from the body, and
// -fingerprint-json compares only the named members.
func TestProxyKeyFromJSON(t *testing.T) {
	u := newCounting(t, nil)
	p := startProxy(t, proxyArgs(t, u.srv.URL, "-key-json", "/id", "-fingerprint-json", "/id,/amount")...)
	a := send(t, http.MethodPost, p.url+"/hooks", `{"id":"evt_1","amount":5,"attempt":1}`)
	b := send(t, http.MethodPost, p.url+"/hooks", `{"id":"evt_1","amount":5,"attempt":2}`)
	require.Equal(t, http.StatusCreated, a.status)
	require.Equal(t, "true", b.header.Get("Idempotent-Replayed"), "the members outside the fingerprint do not matter")
	c := send(t, http.MethodPost, p.url+"/hooks", `{"id":"evt_1","amount":6}`)
	require.Equal(t, http.StatusUnprocessableEntity, c.status)
	require.EqualValues(t, 1, u.runs.Load())
}

// TestProxyUsage: flags the proxy refuses are usage errors.
func TestProxyUsage(t *testing.T) {
	url := "redis://" + redistest.Shared(t).Addr()
	for _, args := range [][]string{
		{"proxy", "-redis", url, "-upstream", "http://127.0.0.1:1"},
		{"proxy", "-redis", url, "-listen", "127.0.0.1:0"},
		{"proxy", "-redis", url, "-listen", "127.0.0.1:0", "-upstream", "ftp://x"},
		{"proxy", "-redis", url, "-listen", "127.0.0.1:0", "-upstream", "http://127.0.0.1:1", "-key-json", "/id", "-key-header", "X-Key"},
		{"proxy", "-redis", url, "-listen", "127.0.0.1:0", "-upstream", "http://127.0.0.1:1", "-key-json", "id"},
		{"proxy", "-redis", url, "-listen", "127.0.0.1:0", "-upstream", "http://127.0.0.1:1", "-methods", "GET"},
	} {
		code, _, errOut := cli(t, args...)
		require.Equal(t, exitUsage, code, "%q: %s", args, errOut)
	}
	code, _, errOut := cli(t, "proxy", "-redis", "redis://"+closedAddr(t), "-listen", "127.0.0.1:0", "-upstream", "http://127.0.0.1:1", "-timeout", "2s")
	require.Equal(t, exitFail, code, "the check at start fails: %s", errOut)
}

// TestProxyHelp: the usage summary lists idem proxy, and its flags are the
// documented ones.
func TestProxyHelp(t *testing.T) {
	code, _, errOut := cli(t, "help")
	require.Equal(t, exitOK, code)
	require.Contains(t, errOut, "idem proxy   -listen ADDR -upstream URL -redis URL")
	code, _, errOut = cli(t, "proxy", "-h")
	require.Equal(t, exitOK, code)
	for _, f := range []string{"listen", "upstream", "redis", "cacert", "timeout", "prefix", "methods", "key-header", "key-json",
		"fingerprint-json", "require-key", "scope-header", "wait", "lease", "retention", "max-body", "max-response", "store-5xx",
		"upstream-timeout", "upstream-cacert", "admin", "shutdown-timeout", "store-timeout", "log-requests"} {
		require.Regexp(t, `\n  -`+f+`[ \n]`, errOut, f)
	}
}

// TestProxyCluster: on Redis Cluster, named as the other commands name it,
// a keyed request runs once and is replayed.
func TestProxyCluster(t *testing.T) {
	cl := redistest.SharedCluster(t)
	u := newCounting(t, nil)
	p := startProxy(t, "-upstream", u.srv.URL, "-redis", "redis+cluster://"+strings.Join(cl.Addrs(), ","), "-prefix", redistest.Prefix(t))
	a := send(t, http.MethodPost, p.url+"/orders", `{}`, "Idempotency-Key", "c1")
	b := send(t, http.MethodPost, p.url+"/orders", `{}`, "Idempotency-Key", "c1")
	require.Equal(t, http.StatusCreated, a.status)
	require.Equal(t, "true", b.header.Get("Idempotent-Replayed"))
	require.Equal(t, a.body, b.body)
	require.EqualValues(t, 1, u.runs.Load())
}

// TestProxyLogFailuresOnly: with -log-requests=false, requests that were
// answered have no log line, a request whose upstream could not be reached
// has its WARN line, and the start is logged as always.
func TestProxyLogFailuresOnly(t *testing.T) {
	u := newCounting(t, nil)
	p := startProxy(t, proxyArgs(t, u.srv.URL, "-log-requests=false", "-scope-header", "X-Account")...)
	for range 2 {
		require.Equal(t, http.StatusCreated, send(t, http.MethodPost, p.url+"/orders", `{}`, "Idempotency-Key", "k1", "X-Account", "a").status)
	}
	require.Equal(t, http.StatusCreated, send(t, http.MethodGet, p.url+"/orders/1", "").status)

	refused := startProxy(t, proxyArgs(t, "http://"+closedAddr(t), "-log-requests=false", "-scope-header", "X-Account")...)
	require.Equal(t, http.StatusBadGateway, send(t, http.MethodPost, refused.url+"/orders", `{}`, "Idempotency-Key", "k2", "X-Account", "a").status)

	require.Equal(t, exitOK, p.stop()) // its lines are all written
	require.NotNil(t, p.logs.find(map[string]any{"event": "start"}))
	require.Nil(t, p.logs.find(map[string]any{"msg": "request"}), "no line for the requests answered: %s", p.logs)
	refused.logs.await(t, map[string]any{"msg": "request", "level": "WARN", "upstream": "failed", "sent": false})
}
