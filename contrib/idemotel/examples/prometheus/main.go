// Command prometheus serves an idempotent HTTP endpoint with idem's metrics
// exported to Prometheus through OpenTelemetry:
//
//	go run ./examples/prometheus -redis localhost:6379
//	curl -X POST -H 'Idempotency-Key: 4f0c' -d '{"sku":"A1"}' localhost:8080/orders   # twice
//	curl localhost:8080/metrics | grep idem_
//
// The Prometheus exporter names the instruments in Prometheus' style:
// idem.operations becomes idem_operations_total, idem.operation.duration
// (unit s) idem_operation_duration_seconds, idem.wait.duration
// idem_wait_duration_seconds and idem.store.duration
// idem_store_duration_seconds; the attributes become the labels idem_kind
// and idem_outcome. For example, the share of requests answered by a replay:
//
//	sum(rate(idem_operations_total{idem_outcome="replayed"}[5m]))
//	  / sum(rate(idem_operations_total[5m]))
//
// and the failures to alert on:
//
//	sum by (idem_outcome) (rate(idem_operations_total{idem_outcome=~"store_unavailable|lease_lost|not_recorded|unreadable"}[5m]))
package main

import (
	"context"
	"flag"
	"log"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemotel"
)

func main() {
	addr := flag.String("addr", ":8080", "listen address")
	redisAddr := flag.String("redis", "localhost:6379", "Redis address")
	flag.Parse()

	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr})
	defer rdb.Close()
	h, shutdown, err := newServer(rdb, prometheus.NewRegistry())
	if err != nil {
		log.Fatal(err)
	}
	defer shutdown()
	log.Printf("listening on %s", *addr)
	log.Fatal(http.ListenAndServe(*addr, h))
}

// newServer returns the application's handler: POST /orders under idem, and
// GET /metrics, the metrics of reg.
func newServer(rdb redis.UniversalClient, reg *prometheus.Registry) (http.Handler, func(), error) {
	// The Prometheus exporter is a reader of the SDK's meter provider.
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))

	// A nil TracerProvider is the otel global: set one with
	// otel.SetTracerProvider for spans, or pass your own.
	g := idem.New(idem.NewRedisStore(rdb), idem.WithObserver(idemotel.Observer(mp, nil)))

	var orders atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("POST /orders", g.Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := orders.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"order":` + strconv.FormatInt(n, 10) + `}`))
	})))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux, func() { _ = mp.Shutdown(context.Background()) }, nil
}
