package idemcaddy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/idemkit/idem/contrib/idemprom"
	"github.com/idemkit/idem/internal/redistest"
)

// The module takes the URLs the idem command takes, and the options idem
// proxy has: Sentinel, a private CA, the store budget, and responses
// stored without their body.

// replayedOnce posts a keyed request twice and fails unless the upstream
// ran it once and the second answer is the first one, replayed.
func replayedOnce(t *testing.T, u *upstream, key string) {
	t.Helper()
	a := post(t, "/payments", `{"amount":1}`, "Idempotency-Key", key)
	b := post(t, "/payments", `{"amount":1}`, "Idempotency-Key", key)
	if a.status != http.StatusCreated || b.header.Get("Idempotent-Replayed") != "true" || a.body != b.body {
		t.Fatalf("%s: first %d %s, repeat %d %q %s", key, a.status, a.body, b.status, b.header.Get("Idempotent-Replayed"), b.body)
	}
	if n, _ := u.count("", key); n != 1 {
		t.Fatalf("%s: the upstream ran %d times, want 1", key, n)
	}
}

// TestSentinelURL: a master found through its Sentinels.
func TestSentinelURL(t *testing.T) {
	f, u := redistest.StartFailover(t), newUpstream(t)
	load(t, proxied("redis redis+sentinel://"+strings.Join(f.SentinelAddrs(), ",")+"/"+f.MasterName(), u))
	replayedOnce(t, u, "sentinel-1")
}

// TestCACert: a TLS Redis whose certificate a private CA signed, trusted
// through ca_cert.
func TestCACert(t *testing.T) {
	ca := redistest.NewCA(t)
	rs, u := redistest.StartTLS(t, ca), newUpstream(t)
	load(t, proxied("redis rediss://"+rs.Addr()+"\nca_cert "+ca.File, u))
	replayedOnce(t, u, "tls-1")
}

// TestStoreTimeout: with Redis frozen and a URL that leaves go-redis its
// timeouts (3 s, retried), store_timeout bounds a keyed request's wait:
// 503, the upstream not called. The bound, 2 s, is ten times the budget.
func TestStoreTimeout(t *testing.T) {
	rs, u := redisServer(t), newUpstream(t)
	load(t, proxied("redis redis://"+rs.Addr()+"\nstore_timeout 200ms", u))
	replayedOnce(t, u, "warm-1")
	rs.Pause(t)
	defer rs.Resume(t)
	start := time.Now()
	r := post(t, "/payments", `{}`, "Idempotency-Key", "budget-1")
	if took := time.Since(start); r.status != http.StatusServiceUnavailable || took > 2*time.Second {
		t.Fatalf("frozen Redis: %d after %v, want 503 within 2s: %s", r.status, took, r.body)
	}
	if n, _ := u.count("", "budget-1"); n != 0 {
		t.Fatalf("the upstream ran %d times, want 0", n)
	}
}

// TestNoBodyStored: max_response_body 0 stores the status and headers but
// no body: the first client gets the whole answer, a repeat the status,
// Location and a problem saying that the body was not stored, and the
// upstream is not run again.
func TestNoBodyStored(t *testing.T) {
	rs, u := redisServer(t), newUpstream(t)
	load(t, proxied("redis "+redisURL(rs)+"\nmax_response_body 0", u))
	a := post(t, "/payments", `{}`, "Idempotency-Key", "nobody-1")
	b := post(t, "/payments", `{}`, "Idempotency-Key", "nobody-1")
	if a.status != http.StatusCreated || !strings.Contains(a.body, `"key":"nobody-1"`) {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
	if b.status != http.StatusCreated || b.header.Get("Idempotent-Replayed") != "true" || b.header.Get("Location") != "/things/nobody-1" ||
		!strings.Contains(b.body, "#response-not-stored") {
		t.Fatalf("repeat: %d %v %s", b.status, b.header, b.body)
	}
	if n, _ := u.count("", "nobody-1"); n != 1 {
		t.Fatalf("the upstream ran %d times, want 1", n)
	}
}

// scrapeCaddy reads Caddy's admin /metrics.
func scrapeCaddy(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := client.Get(fmt.Sprintf("http://localhost:%d/metrics", caddytest.Default.AdminPort))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// caddyOutcomes returns idem_requests_total by outcome, and the
// observations of each histogram.
func caddyOutcomes(fams map[string]*dto.MetricFamily) (map[string]float64, map[string]uint64) {
	total, observed := map[string]float64{}, map[string]uint64{}
	for _, m := range fams[idemprom.RequestsTotal].GetMetric() {
		total[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
	}
	for _, name := range []string{idemprom.RequestDuration, idemprom.UpstreamDuration, idemprom.StoreDuration} {
		for _, m := range fams[name].GetMetric() {
			observed[name] += m.GetHistogram().GetSampleCount()
		}
	}
	return total, observed
}

// TestCaddyMetrics: Caddy's admin /metrics shows idem's metrics, under the
// names idem proxy serves them, counting what was sent.
func TestCaddyMetrics(t *testing.T) {
	rs, u := redisServer(t), newUpstream(t)
	load(t, proxied("redis "+redisURL(rs), u))
	before := scrapeCaddy(t)
	for _, name := range []string{idemprom.RequestsTotal, idemprom.RequestDuration, idemprom.UpstreamDuration,
		idemprom.StoreDuration, idemprom.InFlight, idemprom.StoreFailing} {
		if before[name] == nil {
			t.Fatalf("Caddy's /metrics has no %s", name)
		}
	}
	total0, observed0 := caddyOutcomes(before)
	replayedOnce(t, u, "metrics-1")
	if r := post(t, "/payments", `{"amount":2}`, "Idempotency-Key", "metrics-1"); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("reused key: %d %s", r.status, r.body)
	}
	send(t, http.MethodGet, "/payments", "")
	total, observed := caddyOutcomes(scrapeCaddy(t))
	for o, n := range map[string]float64{"executed": 1, "replayed": 1, "mismatch": 1, "passed_through": 1} {
		if got := total[o] - total0[o]; got != n {
			t.Errorf("idem_requests_total{outcome=%q} went up by %v, want %v", o, got, n)
		}
	}
	for name, n := range map[string]uint64{idemprom.RequestDuration: 4, idemprom.UpstreamDuration: 2} {
		if got := observed[name] - observed0[name]; got != n {
			t.Errorf("%s observed %d more, want %d", name, got, n)
		}
	}
	if observed[idemprom.StoreDuration] == observed0[idemprom.StoreDuration] {
		t.Errorf("%s observed nothing", idemprom.StoreDuration)
	}
}
