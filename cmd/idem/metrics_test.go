package main

import (
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/contrib/idemprom"
)

// scrape reads the admin listener's /metrics as Prometheus does, and
// returns the metric families by name.
func scrape(t *testing.T, admin string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain"), resp.Header.Get("Content-Type"))
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

// outcomes returns idem_requests_total by outcome.
func outcomes(fams map[string]*dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	for _, m := range fams[idemprom.RequestsTotal].GetMetric() {
		out[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
	}
	return out
}

// samples returns the observations of a histogram without labels, or of
// all its series together.
func samples(fams map[string]*dto.MetricFamily, name string) uint64 {
	var n uint64
	for _, m := range fams[name].GetMetric() {
		n += m.GetHistogram().GetSampleCount()
	}
	return n
}

// gauge returns the value of a gauge without labels.
func gauge(t *testing.T, fams map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	require.Contains(t, fams, name)
	return fams[name].GetMetric()[0].GetGauge().GetValue()
}

// TestProxyMetrics: a running proxy's /metrics counts what was sent, by
// outcome, and times it: the requests, the upstream, the store.
func TestProxyMetrics(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	u := newCounting(t, func(w http.ResponseWriter, r *http.Request, run int32) {
		if r.Header.Get("Idempotency-Key") == "slow" {
			close(entered)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	})
	admin := closedAddr(t)
	p := startProxy(t, proxyArgs(t, u.srv.URL, "-admin", admin, "-scope-header", "X-Account", "-max-body", "64")...)
	fams := scrape(t, admin)
	for _, o := range idemprom.Outcomes() {
		require.Contains(t, outcomes(fams), string(o), "every outcome is there from the start")
	}

	post := func(body string, header ...string) int {
		return send(t, http.MethodPost, p.url+"/charges", body, header...).status
	}
	acct := func(key string) []string { return []string{"Idempotency-Key", key, "X-Account", "acct-1"} }
	require.Equal(t, http.StatusCreated, post(`{"amount":1}`, acct("k1")...))
	require.Equal(t, http.StatusCreated, post(`{"amount":1}`, acct("k1")...)) // replayed
	require.Equal(t, http.StatusUnprocessableEntity, post(`{"amount":2}`, acct("k1")...))
	require.Equal(t, http.StatusInternalServerError, post(`{}`, "Idempotency-Key", "k2"))
	require.Equal(t, http.StatusRequestEntityTooLarge, post(`{"note":"`+strings.Repeat("x", 100)+`"}`, acct("k3")...))
	require.Equal(t, http.StatusCreated, send(t, http.MethodGet, p.url+"/charges", "").status)
	done := make(chan int, 1)
	go func() { done <- send(t, http.MethodPost, p.url+"/charges", `{}`, acct("slow")...).status }()
	<-entered
	require.Equal(t, 1.0, gauge(t, scrape(t, admin), idemprom.InFlight), "the slow request is in flight")
	require.Equal(t, http.StatusConflict, post(`{}`, acct("slow")...))
	close(release)
	require.Equal(t, http.StatusCreated, <-done)

	fams = scrape(t, admin)
	got := outcomes(fams)
	want := map[string]float64{"executed": 2, "replayed": 1, "mismatch": 1, "in_progress": 1, "passed_through": 1,
		"scope_missing": 1, "too_large": 1}
	for _, o := range idemprom.Outcomes() {
		require.Equal(t, want[string(o)], got[string(o)], "outcome %s", o)
	}
	require.EqualValues(t, 8, samples(fams, idemprom.RequestDuration), "every request is timed")
	require.EqualValues(t, 3, samples(fams, idemprom.UpstreamDuration), "the requests sent upstream: two executed, one passed through")
	require.Positive(t, samples(fams, idemprom.StoreDuration))
	require.Zero(t, gauge(t, fams, idemprom.InFlight))
	require.Zero(t, gauge(t, fams, idemprom.StoreFailing))
	require.Contains(t, fams, "go_goroutines", "the Go runtime's metrics")
	require.Contains(t, fams, "process_cpu_seconds_total", "the process's")
	require.EqualValues(t, 3, u.runs.Load())
}

// TestProxyMetricsUpstreamDown: an upstream that refuses connections is
// counted as upstream_unreachable.
func TestProxyMetricsUpstreamDown(t *testing.T) {
	admin := closedAddr(t)
	p := startProxy(t, proxyArgs(t, "http://"+closedAddr(t), "-admin", admin)...)
	require.Equal(t, http.StatusBadGateway, send(t, http.MethodPost, p.url+"/charges", `{}`, "Idempotency-Key", "down-1").status)
	fams := scrape(t, admin)
	require.Equal(t, 1.0, outcomes(fams)["upstream_unreachable"])
	require.EqualValues(t, 1, samples(fams, idemprom.UpstreamDuration), "timed to its failure")
}
