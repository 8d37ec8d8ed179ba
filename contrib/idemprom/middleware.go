package idemprom

import (
	"context"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/gateway"
)

// request is what Middleware learns of one request from the Observer.
type request struct {
	event atomic.Pointer[idem.Event]
}

type requestKey struct{}

// Start implements idem.Observer: a keyed request is in flight.
func (m *Metrics) Start(ctx context.Context, _ idem.Kind) context.Context {
	m.inFlight.Inc()
	return ctx
}

// End implements idem.Observer: the keyed request is no longer in flight;
// its time on the store is observed, and its event kept for Middleware.
func (m *Metrics) End(ctx context.Context, e idem.Event) {
	m.inFlight.Dec()
	if e.Store > 0 {
		m.store.Observe(e.Store.Seconds())
	}
	if r, ok := ctx.Value(requestKey{}).(*request); ok {
		r.event.Store(&e)
	}
}

// Middleware returns next counted: each request it serves is counted in
// idem_requests_total and timed in idem_request_duration_seconds by its
// outcome, and its upstream call, if the gateway made one, is timed in
// idem_upstream_duration_seconds. next is Guard.Middleware around the
// handler, of a Guard that has m as its Observer (idem.WithObserver):
// without it, every request counts as passed through. A request whose
// handler panics (a response aborted with http.ErrAbortHandler) is counted,
// then the panic goes on.
func (m *Metrics) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &request{}
		ctx, rep := gateway.WithReport(context.WithValue(r.Context(), requestKey{}, rec))
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			om := m.byOutcome[outcomeOf(rec.event.Load(), rep, sw.status())]
			om.requests.Inc()
			om.duration.Observe(time.Since(start).Seconds())
			if d, ok := rep.Upstream(); ok {
				m.upstream.Observe(d.Seconds())
			}
		}()
		next.ServeHTTP(sw, r.WithContext(ctx))
	})
}

// statusWriter notes the status sent.
type statusWriter struct {
	http.ResponseWriter
	code int
}

// WriteHeader implements http.ResponseWriter.
func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 && code >= 200 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush implements http.Flusher.
func (w *statusWriter) Flush() {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// status returns the status sent, 200 when none was.
func (w *statusWriter) status() int {
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}
