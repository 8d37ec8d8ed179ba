package idemcaddy_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// A configuration idem refuses, or a Redis it cannot use, fails the load:
// Caddy keeps the configuration it had.
func TestProvisionRefuses(t *testing.T) {
	rs := redisServer(t)
	closed := freePorts(1)[0]
	for _, tc := range []struct{ block, want string }{
		{"wait 1s", "redis URL required"},
		{fmt.Sprintf("redis redis://127.0.0.1:%d?dial_timeout=200ms", closed), "redis check"},
		{"redis 127.0.0.1:6379", "not a URL"},
		{"redis " + redisURL(rs) + "\nkey_json id", "key_json"},
		{"redis " + redisURL(rs) + "\nkey_json /id\nkey_header X-Key", "give one of them"},
		{"redis " + redisURL(rs) + "\nmethods GET", "safe method"},
		{"redis " + redisURL(rs) + "\nkey_header bad:name", "invalid header name"},
	} {
		caddytest.AssertLoadError(t, withPort(siteConfig(tc.block, "respond 204")), "caddyfile", tc.want)
	}
}

// key_json takes the key from the body, which reaches the upstream whole.
func TestKeyFromJSON(t *testing.T) {
	rs, u := redisServer(t), newUpstream(t)
	load(t, proxied("redis "+redisURL(rs)+"\nkey_json /id", u))
	first := post(t, "/events", `{"id":"evt_1","amount":3}`)
	again := post(t, "/events", `{"amount":3,"id":"evt_1"}`)
	if first.status != 201 || again.header.Get("Idempotent-Replayed") != "true" || again.body != first.body {
		t.Errorf("key from the body: %d then %d (replayed %q)", first.status, again.status, again.header.Get("Idempotent-Replayed"))
	}
	if n, _ := u.count("", ""); n != 1 { // the upstream saw no Idempotency-Key header
		t.Errorf("upstream ran %d times, want 1", n)
	}
}

// A handler after the module that refuses with a 4xx error (here Caddy's
// error directive) gets that status, stored like any answer; its 5xx
// errors are answered as an unreachable upstream: 502, key released.
func TestHandlerErrors(t *testing.T) {
	rs := redisServer(t)
	load(t, rawSite(`route {
		idempotency `+redisURL(rs)+`
		error /forbidden "nope" 403
		error /broken "broken" 500
	}`))
	r := post(t, "/forbidden", `{}`, "Idempotency-Key", "e1")
	again := post(t, "/forbidden", `{}`, "Idempotency-Key", "e1")
	if r.status != 403 || again.status != 403 || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("error 403: %d then %d (replayed %q), want 403 stored", r.status, again.status, again.header.Get("Idempotent-Replayed"))
	}
	for range 2 {
		if r := post(t, "/broken", `{}`, "Idempotency-Key", "e2"); r.status != 502 || !strings.Contains(r.body, "upstream-unreachable") {
			t.Errorf("error 500: %d %s, want 502 upstream-unreachable, key released", r.status, r.body)
		}
	}
	if r := post(t, "/forbidden", `{}`); r.status != 403 || strings.Contains(r.body, "status") {
		t.Errorf("keyless request: %d %q, want Caddy's own 403", r.status, r.body)
	}
}
