package main

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/idemkit/idem/contrib/idemprom"
)

// The files of deploy/ these tests read.
const (
	dashboardFile = "../../deploy/grafana/idem-dashboard.json"
	alertsFile    = "../../deploy/prometheus/idem-alerts.yaml"
)

var (
	// metricName matches the names of idem's metrics in a query.
	metricName = regexp.MustCompile(`\bidem_[a-z_]+\b`)
	// outcomeMatcher matches a matcher on the outcome label in a query.
	outcomeMatcher = regexp.MustCompile(`outcome\s*(?:=|!=|=~|!~)\s*"([^"]*)"`)
)

// checkQuery fails unless every metric a PromQL query names is in the
// scrape (a histogram by its _bucket, _sum and _count series), and every
// outcome it matches is one idem counts.
func checkQuery(t *testing.T, where, query string, fams map[string]*dto.MetricFamily) {
	t.Helper()
	names := metricName.FindAllString(query, -1)
	require.NotEmpty(t, names, "%s: %q names no idem metric", where, query)
	for _, n := range names {
		if _, ok := fams[n]; ok {
			continue
		}
		base := n
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			base = strings.TrimSuffix(base, suffix)
		}
		f, ok := fams[base]
		require.True(t, ok && f.GetType() == dto.MetricType_HISTOGRAM, "%s: %s is not a metric the proxy serves", where, n)
	}
	for _, m := range outcomeMatcher.FindAllStringSubmatch(query, -1) {
		for o := range strings.SplitSeq(m[1], "|") {
			require.True(t, slices.Contains(idemprom.Outcomes(), idemprom.Outcome(o)), "%s: outcome %q is not one idem counts", where, o)
		}
	}
}

// proxyScrape returns the scrape of a running proxy's /metrics.
func proxyScrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	u := newCounting(t, nil)
	admin := closedAddr(t)
	startProxy(t, proxyArgs(t, u.srv.URL, "-admin", admin)...)
	return scrape(t, admin)
}

// queries returns every string held under the key "expr" or "query" in a
// decoded JSON value.
func queries(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && (k == "expr" || k == "query") {
				out = append(out, s)
				continue
			}
			out = append(out, queries(x)...)
		}
	case []any:
		for _, x := range v {
			out = append(out, queries(x)...)
		}
	}
	return out
}

// TestDashboard: every query of the Grafana dashboard is on metrics a
// running proxy serves, and every panel has one.
func TestDashboard(t *testing.T) {
	data, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var dash struct {
		Title  string
		Panels []map[string]any
	}
	require.NoError(t, json.Unmarshal(data, &dash))
	require.NotEmpty(t, dash.Panels)
	var all any
	require.NoError(t, json.Unmarshal(data, &all))
	fams := proxyScrape(t)
	for _, p := range dash.Panels {
		qs := queries(p)
		require.NotEmpty(t, qs, "panel %q has no query", p["title"])
		for _, q := range qs {
			checkQuery(t, "panel "+p["title"].(string), q, fams)
		}
	}
	seen := map[string]bool{}
	for _, q := range queries(all) {
		for _, n := range metricName.FindAllString(q, -1) {
			seen[strings.TrimSuffix(n, "_bucket")] = true
		}
	}
	for _, n := range []string{idemprom.RequestsTotal, idemprom.RequestDuration, idemprom.UpstreamDuration, idemprom.StoreDuration, idemprom.InFlight, idemprom.StoreFailing} {
		require.True(t, seen[n], "the dashboard shows %s", n)
	}
}

// TestAlertRules: the alert rules are on metrics a running proxy serves,
// each with a severity, a summary, a description and a runbook, and they
// cover the store, in-progress conflicts and the upstream's ambiguity.
func TestAlertRules(t *testing.T) {
	data, err := os.ReadFile(alertsFile)
	require.NoError(t, err)
	var file struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert       string
				Expr        string
				For         string
				Labels      map[string]string
				Annotations map[string]string
			}
		}
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&file))
	fams := proxyScrape(t)
	var alerts []string
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			checkQuery(t, "alert "+r.Alert, r.Expr, fams)
			require.Contains(t, []string{"critical", "warning"}, r.Labels["severity"], r.Alert)
			for _, a := range []string{"summary", "description", "runbook_url"} {
				require.NotEmpty(t, r.Annotations[a], "%s: %s", r.Alert, a)
			}
		}
	}
	require.Equal(t, []string{"IdemStoreFailing", "IdemStoreUnavailable", "IdemInProgressConflicts", "IdemUpstreamAmbiguity"}, alerts)
}
