// Package idemprom exports what idem's HTTP middleware does to Prometheus:
// how many requests were executed, replayed, refused or passed through,
// how long they took, how long the upstream and the store took, how many
// keyed requests are in flight, and whether the store is being refused at
// once (fail fast). `idem proxy` serves these metrics on its admin
// listener and the Caddy module registers them in Caddy's metrics; any
// service that uses Guard.Middleware can do the same:
//
//	m := idemprom.New()
//	prometheus.MustRegister(m)
//	g := idem.New(store, idem.WithObserver(m))
//	defer m.Watch(g)()
//	handler := m.Middleware(g.Middleware()(app))
//
// Metrics is an idem.Observer (it counts the keyed requests in flight and
// times the store) and a prometheus.Collector; Middleware, in front of
// Guard.Middleware, counts every request by its outcome. In a gateway
// built on internal/gateway (the proxy, the Caddy module), Middleware also
// times the upstream and tells its failures apart.
//
// The metrics:
//
//	idem_requests_total{outcome}                counter: requests by outcome (Outcome)
//	idem_request_duration_seconds{outcome}      histogram: the whole request, by outcome
//	idem_upstream_duration_seconds              histogram: the upstream, to the first byte of its answer or its failure
//	idem_store_duration_seconds                 histogram: a keyed request's time waiting for the store
//	idem_keyed_requests_in_flight               gauge: keyed requests started and not ended
//	idem_store_failing                          gauge: 1 while a watched Guard refuses its store at once, else 0
//
// Every outcome's series exists from the start, at 0.
package idemprom
