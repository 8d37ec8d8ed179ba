// Package idemecho runs idem's HTTP middleware in an echo (v4) handler chain.
//
// Middleware returns an echo.MiddlewareFunc that protects the next handler
// with idem.Guard.Middleware, so the contract of docs/http.md applies
// unchanged: the fingerprint, the statuses (400, 409 with Retry-After, 413,
// 422, 503), the stored headers, the Idempotent-Replayed header and the
// problem responses.
//
//	g := idem.New(idem.NewRedisStore(rdb), idem.WithWait(5*time.Second))
//	e := echo.New()
//	e.POST("/payments/:id", pay, idemecho.Middleware(g))
//
// When idem answers by itself (a replay, 400, 409, 413, 422 or 503) the next
// handler does not run and the middleware returns nil. Otherwise the next
// handler runs once, with:
//
//   - c.Response() buffering the response until its record is committed;
//     Hijack is refused and Flush sends nothing while the response is held,
//     as under idem.Guard.Middleware.
//   - c.Request() carrying the Attempt: idem.AttemptFrom(c.Request().Context()).
//     Its context is detached from the client's connection (see
//     idem.Guard.Middleware).
//   - c.Param and c.Get untouched.
//
// An error returned by the handler (echo.NewHTTPError(500), any error) is
// rendered by echo's HTTPErrorHandler before the response is recorded, so
// the stored status is the one the client saw: an error rendered as 5xx
// releases the key, so that a retry runs the handler again, and an error
// rendered as 4xx is stored like any final answer. The error is then returned
// as well, so that middleware in front (a request logger) sees it; the
// response is committed by then, and echo's DefaultHTTPErrorHandler leaves a
// committed response alone (a custom HTTPErrorHandler should do the same).
//
// A panic in the handler releases the key and continues to the middleware
// in front, such as middleware.Recover, which answers on the real response.
//
// Scope keys by the authenticated principal (idem.WithScope); Context gives
// the scope function the echo.Context, where an authentication middleware
// placed before this one stored it.
package idemecho

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemkit/idem"
)

// Middleware returns echo middleware that runs the next handler at most once
// per idempotency key, across every replica sharing g's store, and answers
// repeats with the stored response; see the package documentation and
// idem.Guard.Middleware for the contract and the options.
//
// Middleware panics on a nil Guard or invalid options, at construction.
func Middleware(g *idem.Guard, opts ...idem.HTTPOption) echo.MiddlewareFunc {
	mw := g.Middleware(opts...)
	h := mw(http.HandlerFunc(serveNext))
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			s := &state{c: c, next: next, outer: c.Response()}
			req := c.Request()
			defer func() { c.SetRequest(req); c.SetResponse(s.outer) }()
			h.ServeHTTP(s.outer, req.WithContext(context.WithValue(req.Context(), stateKey{}, s)))
			return s.err
		}
	}
}

// Context returns the echo.Context of a request under Middleware, and
// reports whether there is one. It is meant for the scope function of
// idem.WithScope:
//
//	idem.WithScope(func(r *http.Request) string {
//		c, _ := idemecho.Context(r)
//		account, _ := c.Get("account").(string)
//		return account
//	})
func Context(r *http.Request) (echo.Context, bool) {
	s, ok := r.Context().Value(stateKey{}).(*state)
	if !ok {
		return nil, false
	}
	return s.c, true
}

type stateKey struct{}

// state is one request under Middleware.
type state struct {
	c     echo.Context
	next  echo.HandlerFunc
	outer *echo.Response // the response echo gave the middleware
	err   error          // the next handler's error
}

// serveNext is the http.Handler that idem protects: it runs the next echo
// handler on the request and response writer idem hands it.
func serveNext(w http.ResponseWriter, r *http.Request) {
	s := r.Context().Value(stateKey{}).(*state)
	c := s.c
	c.SetRequest(r)
	if w == http.ResponseWriter(s.outer) { // passed through: a method idem does not protect
		s.err = s.next(c)
		return
	}
	resp := echo.NewResponse(w, c.Echo())
	resp.Status = http.StatusOK // as echo sets it for every request
	c.SetResponse(resp)
	if s.err = s.next(c); s.err != nil {
		c.Error(s.err) // render it now, so that idem records what the client sees
	}
}
