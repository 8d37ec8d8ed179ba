// Package idemgin runs idem's HTTP middleware in a gin handler chain.
//
// Middleware returns a gin.HandlerFunc that protects the rest of the chain
// (the handlers registered after it) with idem.Guard.Middleware, so the
// contract of docs/http.md applies unchanged: the fingerprint, the statuses
// (400, 409 with Retry-After, 413, 422, 503), the stored headers, the
// Idempotent-Replayed header and the problem responses.
//
//	g := idem.New(idem.NewRedisStore(rdb), idem.WithWait(5*time.Second))
//	r := gin.New()
//	r.POST("/payments/:id", idemgin.Middleware(g), pay)
//
// When idem answers by itself (a replay, 400, 409, 413, 422 or 503) the chain
// is aborted and the handlers after the middleware do not run. Otherwise they
// run once, with:
//
//   - c.Writer buffering the response until its record is committed: c.JSON,
//     c.String, c.Data, c.Status, c.AbortWithStatusJSON and the rest work as
//     usual, and headers set after c.Status but before the first write are
//     part of the response, as in gin. Hijack is refused and Flush sends
//     nothing while the response is held, as under idem.Guard.Middleware.
//   - c.Request carrying the Attempt: idem.AttemptFrom(c.Request.Context()),
//     or idem.AttemptFrom(c) when the engine sets ContextWithFallback.
//     Its context is detached from the client's connection (see
//     idem.Guard.Middleware), so c.Writer.CloseNotify never fires.
//   - c.Params, c.Keys and c.Errors untouched.
//
// Handlers before the middleware see the response that reached the client:
// gin.Logger logs the replayed or refused status, c.Errors holds the errors
// the handlers added, and gin.Recovery sees a handler's panic after idem
// released the key.
//
// Scope keys by the authenticated principal (idem.WithScope); Context gives
// the scope function the gin.Context, where an authentication middleware
// placed before this one stored it.
package idemgin

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem"
)

// Middleware returns gin middleware that runs the rest of the handler chain
// at most once per idempotency key, across every replica sharing g's store,
// and answers repeats with the stored response; see the package
// documentation and idem.Guard.Middleware for the contract and the options.
//
// Middleware panics on a nil Guard or invalid options, at construction.
func Middleware(g *idem.Guard, opts ...idem.HTTPOption) gin.HandlerFunc {
	h := g.Middleware(opts...)(http.HandlerFunc(serveChain))
	return func(c *gin.Context) {
		s := &state{c: c, outer: c.Writer}
		req := c.Request
		defer func() { c.Writer, c.Request = s.outer, req }()
		h.ServeHTTP(s.outer, req.WithContext(context.WithValue(req.Context(), stateKey{}, s)))
		if !s.ran {
			c.Abort() // idem answered: the rest of the chain must not run
		}
	}
}

// Context returns the gin.Context of a request under Middleware, and reports
// whether there is one. It is meant for the scope function of
// idem.WithScope:
//
//	idem.WithScope(func(r *http.Request) string {
//		c, _ := idemgin.Context(r)
//		return c.GetString("account")
//	})
func Context(r *http.Request) (*gin.Context, bool) {
	s, ok := r.Context().Value(stateKey{}).(*state)
	if !ok {
		return nil, false
	}
	return s.c, true
}

type stateKey struct{}

// state is one request under Middleware.
type state struct {
	c     *gin.Context
	outer gin.ResponseWriter // the writer gin gave the middleware
	ran   bool               // the rest of the chain ran
}

// serveChain is the http.Handler that idem protects: it runs the rest of the
// gin chain on the request and response writer idem hands it.
func serveChain(w http.ResponseWriter, r *http.Request) {
	s := r.Context().Value(stateKey{}).(*state)
	s.ran = true
	c := s.c
	c.Request = r
	if w == http.ResponseWriter(s.outer) { // passed through: a method idem does not protect
		c.Next()
		return
	}
	rw := &responseWriter{w: w, size: noWritten, status: http.StatusOK}
	c.Writer = rw
	c.Next()
	rw.WriteHeaderNow() // a handler that wrote nothing: its status, as gin's engine does
}

const noWritten = -1

// responseWriter is the gin.ResponseWriter over idem's buffering writer. It
// follows gin's own: WriteHeader only records the status, which is written
// with the first body write (or WriteHeaderNow), so that headers set in
// between are part of the response.
type responseWriter struct {
	w      http.ResponseWriter
	size   int
	status int
}

var _ gin.ResponseWriter = (*responseWriter)(nil)

// Header returns the response's header map.
func (rw *responseWriter) Header() http.Header { return rw.w.Header() }

// WriteHeader records code as the status, unless the header was written.
func (rw *responseWriter) WriteHeader(code int) {
	if code > 0 && !rw.Written() {
		rw.status = code
	}
}

// WriteHeaderNow writes the status and headers, once.
func (rw *responseWriter) WriteHeaderNow() {
	if !rw.Written() {
		rw.size = 0
		rw.w.WriteHeader(rw.status)
	}
}

// Write writes body bytes, writing the header first.
func (rw *responseWriter) Write(p []byte) (int, error) {
	rw.WriteHeaderNow()
	n, err := rw.w.Write(p)
	rw.size += n
	return n, err
}

// WriteString writes body bytes from s, writing the header first.
func (rw *responseWriter) WriteString(s string) (int, error) {
	rw.WriteHeaderNow()
	n, err := io.WriteString(rw.w, s)
	rw.size += n
	return n, err
}

// Status returns the response status.
func (rw *responseWriter) Status() int { return rw.status }

// Size returns the number of body bytes written, or -1 before the header.
func (rw *responseWriter) Size() int { return rw.size }

// Written reports whether the header was written.
func (rw *responseWriter) Written() bool { return rw.size != noWritten }

// Hijack fails: a hijacked connection would escape the record.
func (rw *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(rw.w).Hijack()
}

// Flush writes the header; the body stays held until it is recorded.
func (rw *responseWriter) Flush() {
	rw.WriteHeaderNow()
	_ = http.NewResponseController(rw.w).Flush()
}

// CloseNotify returns a channel that never fires: the handlers run detached
// from the client's connection, so that a client's retry finds the outcome.
func (rw *responseWriter) CloseNotify() <-chan bool { return make(chan bool) }

// Pusher returns nil: server push is not recorded.
func (rw *responseWriter) Pusher() http.Pusher { return nil }

// Unwrap returns idem's writer, for http.ResponseController.
func (rw *responseWriter) Unwrap() http.ResponseWriter { return rw.w }
