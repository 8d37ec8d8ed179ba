package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestMetricsScraped: the names the command's documentation gives are the
// ones Prometheus scrapes.
func TestMetricsScraped(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	h, shutdown, err := newServer(rdb, prometheus.NewRegistry())
	require.NoError(t, err)
	t.Cleanup(shutdown)

	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"sku":"A1"}`))
		req.Header.Set("Idempotency-Key", "4f0c")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		require.Equal(t, http.StatusCreated, w.Code)
		require.Equal(t, `{"order":1}`, w.Body.String())
	}

	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	require.Equal(t, http.StatusOK, w.Code)
	body, err := io.ReadAll(w.Body)
	require.NoError(t, err)
	text := string(body)
	for _, want := range []string{
		`idem_operations_total{idem_kind="http",idem_outcome="executed"`,
		`idem_operations_total{idem_kind="http",idem_outcome="replayed"`,
		`idem_operation_duration_seconds_bucket{idem_kind="http",idem_outcome="executed"`,
		`idem_store_duration_seconds_count{idem_kind="http",idem_outcome="replayed"`,
	} {
		require.Contains(t, text, want)
	}
	require.NotContains(t, text, "idem_wait_duration_seconds_count", "nothing waited")
}
