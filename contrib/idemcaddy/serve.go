package idemcaddy

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/gateway"
)

// ServeHTTP implements caddyhttp.MiddlewareHandler: the rest of the route
// runs under idem's middleware, counted in idem's metrics. For a keyed request, an error the route
// returns (reverse_proxy's failures) is answered here, inside the
// middleware, so that the answer follows the storage rules and the key is
// settled by whether the request reached the upstream; for a request that
// passed through, the error is returned to Caddy as usual.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	c := &call{next: next}
	metrics.Middleware(h.mw(c)).ServeHTTP(w, r)
	return c.err
}

// call is the rest of the route, as the http.Handler idem's middleware
// runs.
type call struct {
	next caddyhttp.Handler
	err  error // returned by next for a request that passed through
}

// ServeHTTP implements http.Handler.
func (c *call) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r = gateway.Prepare(r) // Idempotency-Attempt, the trace of the upstream call
	a, keyed := idem.AttemptFrom(r.Context())
	if !keyed { // no key, or a method without keys
		c.err = c.next.ServeHTTP(w, r)
		return
	}
	uw := &upstreamWriter{ResponseWriter: w}
	defer func() {
		if p := recover(); p != nil && !uw.aborted(p, a) {
			panic(p)
		}
	}()
	if err := c.next.ServeHTTP(uw, r); err != nil {
		answer(uw, r, a, err)
	}
}

// answer answers a keyed request whose route returned err instead of a
// response.
func answer(w *upstreamWriter, r *http.Request, a *idem.Attempt, err error) {
	var he caddyhttp.HandlerError
	switch {
	case w.wrote:
		// The response had begun: what follows is missing, and what the
		// route did is not known.
		a.Abandon()
	case !gateway.TrackerFrom(r.Context()).Wrote() && errors.As(err, &he) &&
		he.StatusCode >= 400 && he.StatusCode < 499:
		// A handler's refusal (error 403, a missing file), not an upstream
		// failure: an answer like any other.
		writeStatus(w, he.StatusCode)
	default:
		gateway.Fail(w, r, err)
	}
}

// writeStatus answers with status and a problem body that only names it.
func writeStatus(w http.ResponseWriter, status int) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(`{"status":` + strconv.Itoa(status) + `,"title":"` + http.StatusText(status) + `"}`))
}

// upstreamWriter is the response writer of the rest of the route: it notes
// whether the response began and whether writing it failed.
type upstreamWriter struct {
	http.ResponseWriter
	wrote       bool // a final status or body bytes were written
	writeFailed bool // a Write to the client failed
}

// WriteHeader implements http.ResponseWriter.
func (w *upstreamWriter) WriteHeader(code int) {
	if code >= 200 || code == http.StatusSwitchingProtocols {
		w.wrote = true
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (w *upstreamWriter) Write(b []byte) (int, error) {
	w.wrote = true
	n, err := w.ResponseWriter.Write(b)
	if err != nil {
		w.writeFailed = true
	}
	return n, err
}

// Unwrap is for http.ResponseController (Flush).
func (w *upstreamWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// aborted settles the key when reverse_proxy aborted the response (it
// panics with http.ErrAbortHandler when copying the upstream's body fails)
// and reports whether the panic ends here:
//
//   - no write to the client failed, so reading the upstream's body did:
//     the upstream acted and its answer is lost, so the attempt is
//     abandoned and the panic goes on, aborting the client's connection;
//   - a write to the client failed (a response too large to store, sent
//     as it came to a client that left): the upstream's answer was read,
//     so the panic ends and the middleware records its status and headers,
//     as for any response too large to store; a retry does not run the
//     upstream again.
//
// Other panics go on.
func (w *upstreamWriter) aborted(p any, a *idem.Attempt) bool {
	if err, ok := p.(error); !ok || !errors.Is(err, http.ErrAbortHandler) {
		return false
	}
	if w.writeFailed {
		return true
	}
	a.Abandon()
	return false
}
