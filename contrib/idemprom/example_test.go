package idemprom_test

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemprom"
)

// A service's payments, protected by idem's middleware and counted in
// Prometheus, with /metrics beside them.
func ExampleMetrics() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	m := idemprom.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	g := idem.New(idem.NewRedisStore(rdb), idem.WithObserver(m))
	defer m.Watch(g)()

	payments := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /payments", m.Middleware(g.Middleware()(payments)))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	_ = http.ListenAndServe(":8080", mux)
}
