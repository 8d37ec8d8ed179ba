package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemprom"
)

// readyTimeout bounds the check behind /readyz.
const readyTimeout = 5 * time.Second

// newAdminServer returns the admin listener's server: /healthz answers 200
// while the process serves; /readyz answers 200 when Redis passes idem's
// check (RedisStore.Check), else 503 with the reason; /metrics serves
// metrics in Prometheus's text format.
func newAdminServer(store *idem.RedisStore, metrics prometheus.Gatherer, log *slog.Logger) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(metrics, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		if err := store.Check(ctx); err != nil {
			log.Warn("idem proxy: not ready", "event", "not_ready", "err", err)
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
	})
	return &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
}

// newRegistry returns the registry /metrics serves: idem's metrics, the Go
// runtime's and the process's.
func newRegistry(metrics *idemprom.Metrics) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
