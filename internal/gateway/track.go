package gateway

import (
	"context"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
)

// Tracker tells whether any of a request was written to an upstream
// connection. It learns it from net/http/httptrace: the transport reports
// the request's headers written (to the connection's buffer, possibly not
// yet flushed: the tracker errs towards "written"). Before that, a failure
// (a refused connection, a failed dial or TLS handshake) means that the
// upstream cannot have acted on the request.
type Tracker struct {
	wrote  atomic.Bool
	writes atomic.Int32
	// bodyFailed: reading the upstream's response body failed (WatchBody).
	bodyFailed atomic.Bool
}

// Wrote reports whether the request's headers were written to an upstream
// connection. On a nil Tracker it reports true: without a trace, the
// request may have been sent.
func (t *Tracker) Wrote() bool {
	return t == nil || t.wrote.Load()
}

// Writes returns how many times the request's headers were written: more
// than once when the transport sent it again on another connection.
func (t *Tracker) Writes() int {
	if t == nil {
		return 0
	}
	return int(t.writes.Load())
}

type trackerKey struct{}

// Track returns a shallow copy of r whose context records, through
// net/http/httptrace, whether r was written to an upstream connection, and
// the Tracker that tells. The trace composes with any trace r's context
// already has, and times the upstream's answer in the context's Report,
// if any (WithReport). Send the returned request (or one made from it that
// keeps its context, as httputil.ReverseProxy and Caddy's reverse_proxy
// do).
func Track(r *http.Request) (*http.Request, *Tracker) {
	t := &Tracker{}
	rep := reportFrom(r.Context())
	ctx := context.WithValue(r.Context(), trackerKey{}, t)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GetConn: func(string) { rep.began() },
		WroteHeaders: func() {
			t.writes.Add(1)
			t.wrote.Store(true)
		},
		GotFirstResponseByte: rep.answered,
	})
	return r.WithContext(ctx), t
}

// TrackerFrom returns the Tracker of a request made by Track (or Prepare),
// or nil.
func TrackerFrom(ctx context.Context) *Tracker {
	t, _ := ctx.Value(trackerKey{}).(*Tracker)
	return t
}
