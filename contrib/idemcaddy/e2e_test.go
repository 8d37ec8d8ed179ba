package idemcaddy_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// The behaviours of the module through Caddy and reverse_proxy, against an
// upstream that counts its executions, on a real redis-server.

// proxied returns a Caddyfile that runs the block's idempotency in front of
// reverse_proxy to u.
func proxied(block string, u *upstream) string {
	return siteConfig(block, "reverse_proxy "+u.Listener.Addr().String())
}

// Thirty-two concurrent requests with one key run the upstream once, and
// all get the same answer: one as the upstream gave it, the others as
// replays.
func TestConcurrentDuplicates(t *testing.T) {
	rs, u := redisServer(t), newUpstream(t)
	load(t, proxied("redis "+redisURL(rs)+"\nwait 10s", u))

	const n = 32
	replies := make([]reply, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			replies[i] = post(t, "/payments", `{"amount":100}`, "Idempotency-Key", "dup-1")
		})
	}
	close(start)
	wg.Wait()
	if runs, _ := u.count("", "dup-1"); runs != 1 {
		t.Fatalf("upstream ran %d times, want 1", runs)
	}
	replayed := 0
	for i, r := range replies {
		if r.status != 201 || r.body != replies[0].body || r.header.Get("Location") != "/things/dup-1" {
			t.Errorf("reply %d: %d %q Location %q, want reply 0's: %d %q", i, r.status, r.body, r.header.Get("Location"), replies[0].status, replies[0].body)
		}
		if r.header.Get("Idempotent-Replayed") == "true" {
			replayed++
		}
	}
	if replayed != n-1 {
		t.Errorf("%d replies marked replayed, want %d", replayed, n-1)
	}
}

// A repeat gets the stored answer with Idempotent-Replayed; the key with
// another body gets 422; neither reaches the upstream.
func TestReplayAndReusedKey(t *testing.T) {
	rs, u := redisServer(t), newUpstream(t)
	load(t, proxied("redis "+redisURL(rs), u))

	first := post(t, "/payments", `{"amount":100}`, "Idempotency-Key", "k1")
	if first.status != 201 || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %d replayed=%q %s", first.status, first.header.Get("Idempotent-Replayed"), first.body)
	}
	again := post(t, "/payments", `{ "amount": 100 }`, "Idempotency-Key", "k1")
	if again.status != 201 || again.body != first.body || again.header.Get("Idempotent-Replayed") != "true" ||
		again.header.Get("Location") != "/things/k1" || again.header.Get("Content-Type") != "application/json" {
		t.Errorf("repeat: %d %q %v, want the first answer replayed", again.status, again.body, again.header)
	}
	reused := post(t, "/payments", `{"amount":999}`, "Idempotency-Key", "k1")
	if reused.status != 422 || !strings.Contains(reused.body, "key-reused") {
		t.Errorf("reused key: %d %s, want 422 key-reused", reused.status, reused.body)
	}
	if runs, attempts := u.count("", "k1"); runs != 1 || attempts[0] != "1" {
		t.Errorf("upstream ran %d times with attempts %v, want once with Idempotency-Attempt 1", runs, attempts)
	}
}

// With scope_header, equal keys of two scopes are two operations, and a
// keyed request without the header is refused before the upstream.
func TestScopes(t *testing.T) {
	rs, u := redisServer(t), newUpstream(t)
	load(t, proxied("redis "+redisURL(rs)+"\nscope_header X-Account", u))

	a := post(t, "/payments", `{"amount":1}`, "Idempotency-Key", "same", "X-Account", "acct-a")
	b := post(t, "/payments", `{"amount":1}`, "Idempotency-Key", "same", "X-Account", "acct-b")
	if a.status != 201 || b.status != 201 || b.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("two scopes: %d, %d (replayed %q)", a.status, b.status, b.header.Get("Idempotent-Replayed"))
	}
	if again := post(t, "/payments", `{"amount":1}`, "Idempotency-Key", "same", "X-Account", "acct-b"); again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("repeat in scope b: %d, not replayed", again.status)
	}
	na, _ := u.count("acct-a", "same")
	nb, _ := u.count("acct-b", "same")
	if na != 1 || nb != 1 {
		t.Errorf("runs: scope a %d, scope b %d, want 1 each", na, nb)
	}
	none := post(t, "/payments", `{"amount":1}`, "Idempotency-Key", "same")
	if none.status != 500 || !strings.Contains(none.body, "scope-missing") {
		t.Errorf("no scope: %d %s, want 500 scope-missing", none.status, none.body)
	}
	two, _ := try("POST", "/payments", `{"amount":1}`, "Idempotency-Key", "same", "X-Account", "acct-a", "X-Account", "acct-b")
	if two.status != 500 || !strings.Contains(two.body, "scope-missing") {
		t.Errorf("two scopes in one request: %d %s, want 500 scope-missing", two.status, two.body)
	}
	if n, _ := u.count("", "same"); n != 0 {
		t.Errorf("a request without scope reached the upstream %d times", n)
	}
}

// Requests without a key and other methods pass through, every time, with
// no Idempotency-Attempt; require_key refuses the keyless ones; a
// client-sent Idempotency-Attempt never reaches the upstream.
func TestPassThrough(t *testing.T) {
	rs, u := redisServer(t), newUpstream(t)
	load(t, proxied("redis "+redisURL(rs), u))

	for range 2 {
		if r := post(t, "/payments", `{"amount":1}`, "Idempotency-Attempt", "7"); r.status != 201 {
			t.Fatalf("keyless POST: %d %s", r.status, r.body)
		}
		if r := send(t, "PUT", "/payments", `{"amount":1}`, "Idempotency-Key", "put-1", "Idempotency-Attempt", "7"); r.status != 201 {
			t.Fatalf("PUT: %d %s", r.status, r.body)
		}
	}
	if n, attempts := u.count("", ""); n != 2 || attempts[0] != "" || attempts[1] != "" {
		t.Errorf("keyless POSTs: %d runs, attempts %q, want 2 without Idempotency-Attempt", n, attempts)
	}
	if n, attempts := u.count("", "put-1"); n != 2 || attempts[0] != "" {
		t.Errorf("PUTs: %d runs, attempts %q, want 2 without Idempotency-Attempt", n, attempts)
	}
	post(t, "/payments", `{"amount":1}`, "Idempotency-Key", "own-attempt", "Idempotency-Attempt", "7")
	if _, attempts := u.count("", "own-attempt"); len(attempts) != 1 || attempts[0] != "1" {
		t.Errorf("keyed request with a client's Idempotency-Attempt 7: upstream got %q, want 1", attempts)
	}

	load(t, proxied("redis "+redisURL(rs)+"\nrequire_key", u))
	if r := post(t, "/payments", `{"amount":1}`); r.status != 400 || !strings.Contains(r.body, "key-missing") {
		t.Errorf("require_key, no key: %d %s, want 400 key-missing", r.status, r.body)
	}
	if n, _ := u.count("", ""); n != 2 {
		t.Errorf("require_key: a keyless request reached the upstream")
	}
}

// The upstream acts and drops the connection, before or in the middle of
// its answer: 502 (or a broken response), the key stays taken (409, no
// second execution) until the lease ends; then the retry runs as attempt
// 2, and its answer is replayed. An empty body is not sent twice by the
// transport on a reused connection either.
func TestUpstreamDropsAfterActing(t *testing.T) {
	rs, u := redisServer(t), newUpstream(t)
	const lease = time.Second
	load(t, proxied(fmt.Sprintf("redis %s\nlease %s", redisURL(rs), lease), u))

	for _, tc := range []struct{ name, path, body string }{
		{"before the answer", "/drop/pay", `{"amount":5}`},
		{"empty body", "/drop/empty", ""},
		{"in the answer", "/partial/pay", `{"amount":5}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "drop " + tc.name
			post(t, "/warm", `{}`)        // a kept-alive connection to the upstream, which the next request reuses
			client.CloseIdleConnections() // a new connection: the client's transport does not retry on it
			dropped := time.Now()
			r, err := try("POST", tc.path, tc.body, "Idempotency-Key", key)
			switch {
			case strings.HasPrefix(tc.path, "/partial/"):
				if err == nil {
					t.Fatalf("answer broken off: %d %q, want a broken response", r.status, r.body)
				}
			case err != nil:
				t.Fatal(err)
			case r.status != 502 || r.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(r.body, "upstream-failed"):
				t.Fatalf("dropped connection: %d %q %s, want a 502 problem upstream-failed", r.status, r.header.Get("Content-Type"), r.body)
			}
			var took reply
			for deadline := time.Now().Add(10 * lease); ; {
				took = post(t, tc.path, tc.body, "Idempotency-Key", key)
				if took.status != 409 {
					break
				}
				if n, attempts := u.count("", key); n != 1 {
					t.Fatalf("upstream ran %d times (attempts %v) while the first attempt's lease ran", n, attempts)
				}
				if time.Now().After(deadline) {
					t.Fatal("the key was still taken long after the lease")
				}
				time.Sleep(50 * time.Millisecond)
			}
			if since := time.Since(dropped); since < lease-lease/10 {
				t.Errorf("taken over %v after the drop, before the lease of %v ran out", since, lease)
			}
			var body struct{ Attempt string }
			if err := json.Unmarshal([]byte(took.body), &body); took.status != 201 || err != nil || body.Attempt != "2" {
				t.Fatalf("retry after the lease: %d %s, want 201 from attempt 2", took.status, took.body)
			}
			if n, attempts := u.count("", key); n != 2 || strings.Join(attempts, ",") != "1,2" {
				t.Errorf("upstream: %d runs, attempts %v, want 2 runs: 1 then 2", n, attempts)
			}
			if again := post(t, tc.path, tc.body, "Idempotency-Key", key); again.body != took.body || again.header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("after attempt 2: %d %s, want its answer replayed", again.status, again.body)
			}
			if n, _ := u.count("", key); n != 2 {
				t.Errorf("upstream ran %d times, want 2", n)
			}
		})
	}
}

// An upstream that cannot be reached was never sent the request: the key
// is released, so the retry tries again at once, also with store_5xx.
func TestUpstreamUnreachable(t *testing.T) {
	rs := redisServer(t)
	closed := freePorts(1)[0]
	load(t, siteConfig("redis "+redisURL(rs)+"\nlease 1m\nstore_5xx", fmt.Sprintf("reverse_proxy 127.0.0.1:%d", closed)))
	for i := range 2 {
		r := post(t, "/payments", `{"amount":1}`, "Idempotency-Key", "refused-1")
		if r.status != 502 || r.header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("request %d to a refused upstream: %d %s, want a 502 problem (not 409: the key is released)", i, r.status, r.body)
		}
	}
}

// The upstream's statuses follow the middleware's storage rules: 4xx is
// stored, 5xx releases the key; store_5xx stores the upstream's 5xx too.
func TestUpstreamStatuses(t *testing.T) {
	rs, u := redisServer(t), newUpstream(t)
	load(t, proxied("redis "+redisURL(rs), u))
	for _, tc := range []struct {
		path string
		runs int
	}{{"/status/404", 1}, {"/status/500", 2}, {"/status/503", 2}} {
		key := "default" + tc.path
		for range 2 {
			post(t, tc.path, `{}`, "Idempotency-Key", key)
		}
		if n, _ := u.count("", key); n != tc.runs {
			t.Errorf("%s twice: upstream ran %d times, want %d", tc.path, n, tc.runs)
		}
	}

	load(t, proxied("redis "+redisURL(rs)+"\nstore_5xx", u))
	for _, tc := range []struct {
		path string
		runs int
	}{{"/status/500", 1}, {"/status/503", 1}, {"/status/502", 1}, {"/status/429", 2}} {
		key := "store5xx" + tc.path
		var last reply
		for range 2 {
			last = post(t, tc.path, `{}`, "Idempotency-Key", key)
		}
		if n, _ := u.count("", key); n != tc.runs {
			t.Errorf("store_5xx, %s twice: upstream ran %d times, want %d", tc.path, n, tc.runs)
		}
		if tc.runs == 1 && (last.header.Get("Idempotent-Replayed") != "true" || !strings.HasPrefix(last.body, "status ")) {
			t.Errorf("store_5xx, %s repeated: %d %q, want the stored answer", tc.path, last.status, last.body)
		}
	}
}

// A frozen Redis answers nothing: 503, and the upstream is not called.
// Once it answers again, the retry runs, once: it may first be refused
// (503) while the Guard still holds Redis as failing, until its probe
// succeeds, but it never finds its key taken (409).
func TestRedisFrozen(t *testing.T) {
	rs, u := redisServer(t), newUpstream(t)
	load(t, proxied("redis "+redisURL(rs), u))
	rs.Pause(t)
	r := post(t, "/payments", `{"amount":1}`, "Idempotency-Key", "frozen-1")
	rs.Resume(t)
	if r.status != 503 || !strings.Contains(r.body, "store-unavailable") || r.header.Get("Retry-After") == "" {
		t.Errorf("frozen Redis: %d %v %s, want 503 store-unavailable with Retry-After", r.status, r.header, r.body)
	}
	if n, _ := u.count("", "frozen-1"); n != 0 {
		t.Fatalf("upstream ran %d times while Redis was frozen", n)
	}
	r = post(t, "/payments", `{"amount":1}`, "Idempotency-Key", "frozen-1")
	for deadline := time.Now().Add(10 * time.Second); r.status == http.StatusServiceUnavailable && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond) // the Guard's probe of Redis: no event to wait for
		r = post(t, "/payments", `{"amount":1}`, "Idempotency-Key", "frozen-1")
	}
	if r.status != http.StatusCreated {
		t.Errorf("after Redis resumed: %d %s", r.status, r.body)
	}
	if n, _ := u.count("", "frozen-1"); n != 1 {
		t.Errorf("after Redis resumed, the upstream ran %d times, want 1", n)
	}
}

// The README's example: forward_auth sets the scope header and deletes any
// value the client sent, so a client cannot use another account's scope.
func TestScopeFromForwardAuth(t *testing.T) {
	rs, u := redisServer(t), newUpstream(t)
	auth := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("Authorization") {
		case "Bearer a":
			w.Header().Set("X-Account", "acct-a")
		case "Bearer anonymous": // let through without an account
		default:
			w.WriteHeader(http.StatusUnauthorized)
		}
	}))
	t.Cleanup(auth.Close)
	load(t, rawSite(fmt.Sprintf(`forward_auth %s {
		uri /verify
		copy_headers X-Account
	}
	idempotency {
		redis %s
		scope_header X-Account
	}
	reverse_proxy %s`, auth.Listener.Addr(), redisURL(rs), u.Listener.Addr())))

	first := post(t, "/payments", `{"amount":1}`, "Idempotency-Key", "fa-1", "Authorization", "Bearer a", "X-Account", "acct-b")
	if first.status != 201 {
		t.Fatalf("account a: %d %s", first.status, first.body)
	}
	if na, _ := u.count("acct-a", "fa-1"); na != 1 {
		t.Errorf("upstream ran %d times under acct-a, want 1 (the client's X-Account must be replaced)", na)
	}
	if nb, _ := u.count("acct-b", "fa-1"); nb != 0 {
		t.Errorf("upstream ran %d times under the client's own X-Account", nb)
	}
	anon := post(t, "/payments", `{"amount":1}`, "Idempotency-Key", "fa-1", "Authorization", "Bearer anonymous", "X-Account", "acct-a")
	if anon.status != 500 || !strings.Contains(anon.body, "scope-missing") || anon.body == first.body {
		t.Errorf("no account, client-sent X-Account acct-a: %d %s, want 500 scope-missing, not acct-a's answer", anon.status, anon.body)
	}
}
