package idemcaddy

import (
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/idemkit/idem"
)

// ServeHTTP implements caddyhttp.MiddlewareHandler. The rest of the route
// runs under idem's middleware; an error it returns for a keyed request
// (reverse_proxy's failures) is answered here, inside the middleware, so
// that the answer follows the storage rules and the ambiguous-failure rule;
// for requests that pass through, it is returned to Caddy as usual.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	stripAttempt(r)
	c := &call{next: next}
	h.mw(c).ServeHTTP(w, r)
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
	a, ok := idem.AttemptFrom(r.Context())
	if !ok { // passed through: no key, or a method without keys
		c.err = c.next.ServeHTTP(w, r)
		return
	}
	setAttempt(r, a)
	r, sent := trackSent(r)
	sw := &statusWriter{ResponseWriter: w}
	err := c.next.ServeHTTP(sw, r)
	if err == nil {
		return
	}
	answerFailure(sw, r, a, err, sent())
}
