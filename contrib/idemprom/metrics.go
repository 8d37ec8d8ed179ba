package idemprom

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idem"
)

// Names of the metrics.
const (
	RequestsTotal    = "idem_requests_total"
	RequestDuration  = "idem_request_duration_seconds"
	UpstreamDuration = "idem_upstream_duration_seconds"
	StoreDuration    = "idem_store_duration_seconds"
	InFlight         = "idem_keyed_requests_in_flight"
	StoreFailing     = "idem_store_failing"
)

// Buckets of the histograms, in seconds: requests and upstream calls up to
// a minute (the proxy's -upstream-timeout), store calls around the store
// budget (1s by default).
var (
	requestBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	storeBuckets   = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}
)

// Metrics holds idem's Prometheus metrics (see the package documentation).
// It is a prometheus.Collector: register it with any number of registries
// (Caddy makes one per configuration; the counts go on across them). It is
// an idem.Observer: give it to the Guards whose requests it counts
// (idem.WithObserver). Its methods are safe for concurrent use.
type Metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	upstream prometheus.Histogram
	store    prometheus.Histogram
	inFlight prometheus.Gauge
	failing  prometheus.GaugeFunc
	// byOutcome holds the children of requests and duration of each
	// Outcome, looked up once.
	byOutcome map[Outcome]outcomeMetrics

	mu     sync.Mutex
	guards map[*idem.Guard]int // watched, with how many times
}

// outcomeMetrics are the metrics of one Outcome's requests.
type outcomeMetrics struct {
	requests prometheus.Counter
	duration prometheus.Observer
}

var _ prometheus.Collector = (*Metrics)(nil)
var _ idem.Observer = (*Metrics)(nil)

// New returns idem's metrics, registered nowhere yet.
func New() *Metrics {
	m := &Metrics{guards: map[*idem.Guard]int{}}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: RequestsTotal,
		Help: "Requests served, by outcome: executed, replayed, in_progress, mismatch, store_unavailable, upstream_failed, upstream_unreachable, upstream_timeout, passed_through, key_missing, scope_missing, too_large.",
	}, []string{"outcome"})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    RequestDuration,
		Help:    "Time to serve a request, from its arrival to the end of its response, by outcome.",
		Buckets: requestBuckets,
	}, []string{"outcome"})
	m.byOutcome = make(map[Outcome]outcomeMetrics, len(Outcomes()))
	for _, o := range Outcomes() {
		m.byOutcome[o] = outcomeMetrics{m.requests.WithLabelValues(string(o)), m.duration.WithLabelValues(string(o))}
	}
	m.upstream = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    UpstreamDuration,
		Help:    "Time from asking for an upstream connection to the first byte of the upstream's response, or to its failure.",
		Buckets: requestBuckets,
	})
	m.store = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    StoreDuration,
		Help:    "Time a keyed request spent waiting for the store: its claim, the completion, the release.",
		Buckets: storeBuckets,
	})
	m.inFlight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: InFlight,
		Help: "Keyed requests started and not ended.",
	})
	m.failing = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: StoreFailing,
		Help: "1 while the store's calls keep failing and new keyed requests are refused at once (fail fast), else 0.",
	}, m.storeFailing)
	return m
}

// collectors returns m's collectors.
func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.duration, m.upstream, m.store, m.inFlight, m.failing}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

// Watch makes idem_store_failing report g's store state (Guard.StoreState)
// too, until the returned function is called: the gauge is 1 while any
// watched Guard refuses its store at once. Watching a Guard twice needs two
// calls of their functions to stop.
func (m *Metrics) Watch(g *idem.Guard) (stop func()) {
	m.mu.Lock()
	m.guards[g]++
	m.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			if m.guards[g]--; m.guards[g] <= 0 {
				delete(m.guards, g)
			}
			m.mu.Unlock()
		})
	}
}

// storeFailing is the value of idem_store_failing.
func (m *Metrics) storeFailing() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	for g := range m.guards {
		if g.StoreState() == idem.StoreFailing {
			return 1
		}
	}
	return 0
}
