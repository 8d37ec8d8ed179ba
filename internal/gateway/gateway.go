// Package gateway holds what a gateway in front of an HTTP upstream needs
// around idem's middleware: the attempt header the upstream gets, a trace
// that tells whether a request reached the upstream's connection, and the
// answer to an upstream failure that settles the key by that trace. `idem
// proxy` (an httputil.ReverseProxy) and the Caddy module (reverse_proxy)
// share it; both send through an http.Transport.
//
// The order inside the middleware's handler:
//
//	r = gateway.Prepare(r)              // attempt header, trace
//	... send r upstream ...
//	gateway.Fail(w, r, err)             // when the upstream call failed
//
// and, where the upstream's response body is read, WatchBody and Aborted.
package gateway

import (
	"context"
	"io"
	"net/http"
	"strconv"

	"github.com/idemkit/idem"
)

// AttemptHeader is the request header that tells the upstream which attempt
// of an operation a request is: "1" the first time, higher when an earlier
// attempt's outcome was not known (the upstream should then check its own
// records for the key before acting again). It is the attempt's fence
// (idem.Attempt.Fence).
const AttemptHeader = "Idempotency-Attempt"

// SetAttempt prepares the headers h of a request for the upstream: it
// removes every AttemptHeader the client sent, so that the upstream never
// takes a client's value for the gateway's, and when ctx carries an idem
// Attempt (the request runs under the middleware) it sets AttemptHeader to
// the attempt's fence. Call it on every request, protected or passed
// through.
func SetAttempt(ctx context.Context, h http.Header) {
	h.Del(AttemptHeader)
	if a, ok := idem.AttemptFrom(ctx); ok && a.Fence > 0 {
		h.Set(AttemptHeader, strconv.FormatInt(a.Fence, 10))
	}
}

// Prepare returns the request to send upstream in place of r, a request
// inside the middleware's handler (or passed through by it): its headers
// prepared by SetAttempt, its body made one the transport never sends twice
// (NoReplay) when it runs under the middleware, and its context carrying a
// Tracker (see Track). r's header map is changed in place.
func Prepare(r *http.Request) *http.Request {
	SetAttempt(r.Context(), r.Header)
	if _, keyed := idem.AttemptFrom(r.Context()); keyed {
		NoReplay(r)
	}
	r, _ = Track(r)
	return r
}

// NoReplay makes r a request that Go's http.Transport sends at most once.
// The transport sends a request again on a new connection when the
// connection it used broke before any response, if the request is
// "replayable": no body (or GetBody set) and an Idempotency-Key header.
// The upstream may have acted on the first copy, so under idem the second
// would run the operation twice in one attempt. NoReplay clears GetBody and
// gives a request without a body an empty one of unknown length, which the
// transport sends as an empty chunked body on POST, PUT and PATCH (and as
// no body on methods that take none). r may be the request a proxy will clone (httputil.ReverseProxy
// and Caddy's reverse_proxy keep a body of unknown length) or its clone.
func NoReplay(r *http.Request) {
	r.GetBody = nil
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		r.Body, r.ContentLength = emptyBody{}, -1
	}
}

// emptyBody is an empty body that is not http.NoBody.
type emptyBody struct{}

func (emptyBody) Read([]byte) (int, error) { return 0, io.EOF }
func (emptyBody) Close() error             { return nil }
