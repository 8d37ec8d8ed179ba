// Package idemfiber runs idem's HTTP middleware in a fiber (v2) handler
// chain.
//
// New returns a fiber.Handler that runs c.Next() inside
// idem.Guard.Middleware, so the contract of docs/http.md applies unchanged:
// the fingerprint, the statuses (400, 409 with Retry-After, 413, 422, 503),
// the stored headers, the Idempotent-Replayed header and the problem
// responses.
//
//	g := idem.New(idem.NewRedisStore(rdb), idem.WithWait(5*time.Second))
//	app := fiber.New()
//	app.Post("/payments/:id", idemfiber.New(g), pay)
//
// fiber runs on fasthttp, not net/http, so each protected request is
// converted: the method, the request URI as received, every header value
// (a repeated Idempotency-Key header stays repeated, and gets 400) and the
// raw body. Safe methods (GET, HEAD, OPTIONS, TRACE), which idem never
// protects, skip the conversion.
//
// When idem answers by itself (a replay, 400, 409, 413, 422 or 503) the next
// handlers do not run. Otherwise c.Next() runs once, with the Attempt in
// c.UserContext() (idem.AttemptFrom(c.UserContext())), and then its fasthttp
// response is recorded:
//
//   - An error returned by the next handlers is rendered first by the app's
//     error handler, so the stored status is the one the client saw: a 5xx
//     releases the key, so that a retry runs the handlers again. The error is
//     not returned further: the response is final.
//   - A body set as a stream (c.SendStream, c.SendFile, SetBodyStream) is
//     read to its end and recorded in full (up to WithMaxResponseBody, as any
//     body; a larger one is sent once and not stored). A stream that fails
//     while it is read is answered with the app's error handler and a 500
//     naming the failure, and the key is released. An endless stream (server
//     sent events) never ends: keep it away from the middleware.
//   - Headers set before New ran (by middleware in front, such as requestid
//     or cors) are kept on every answer, replays and refusals included.
//
// A panic in the next handlers releases the key, drops what they wrote to the
// response, and continues to fiber's recover middleware in front.
//
// Scope keys by the authenticated principal (idem.WithScope); Ctx gives the
// scope function the fiber.Ctx, where an authentication middleware placed
// before this one stored it (c.Locals).
package idemfiber

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/idemkit/idem"
)

// New returns fiber middleware that runs the rest of the handler chain at
// most once per idempotency key, across every replica sharing g's store, and
// answers repeats with the stored response; see the package documentation
// and idem.Guard.Middleware for the contract and the options.
//
// New panics on a nil Guard or invalid options, at construction.
func New(g *idem.Guard, opts ...idem.HTTPOption) fiber.Handler {
	h := g.Middleware(opts...)(http.HandlerFunc(serveNext))
	return func(c *fiber.Ctx) error {
		switch c.Method() {
		case fiber.MethodGet, fiber.MethodHead, fiber.MethodOptions, fiber.MethodTrace:
			return c.Next() // never protected by idem: no conversion
		}
		s := &state{c: c, w: newResponseWriter(c.Response())}
		uctx := c.UserContext()
		finished := false
		defer func() {
			c.SetUserContext(uctx)
			if !finished { // a panic: what the handlers wrote never reaches the client
				s.w.reset()
			}
		}()
		h.ServeHTTP(s.w, request(c, context.WithValue(uctx, stateKey{}, s)))
		finished = true
		return s.err
	}
}

// Ctx returns the fiber.Ctx of a request under New, and reports whether
// there is one. It is meant for the scope function of idem.WithScope:
//
//	idem.WithScope(func(r *http.Request) string {
//		c, _ := idemfiber.Ctx(r)
//		account, _ := c.Locals("account").(string)
//		return account
//	})
func Ctx(r *http.Request) (*fiber.Ctx, bool) {
	s, ok := r.Context().Value(stateKey{}).(*state)
	if !ok {
		return nil, false
	}
	return s.c, true
}

type stateKey struct{}

// state is one request under New.
type state struct {
	c   *fiber.Ctx
	w   *responseWriter // writes idem's answer into the fasthttp response
	err error           // the next handlers' error, when passed through
}

// ErrBodyStream reports that a response body stream failed while it was read
// to be recorded; the client gets a 500 and the key is released.
var ErrBodyStream = errors.New("idemfiber: the response body stream failed while it was recorded")

// serveNext is the http.Handler that idem protects: it runs c.Next() and
// records the fasthttp response into the writer idem hands it.
func serveNext(w http.ResponseWriter, r *http.Request) {
	s := r.Context().Value(stateKey{}).(*state)
	c := s.c
	c.SetUserContext(r.Context())
	if w == http.ResponseWriter(s.w) { // passed through: a method idem does not protect
		s.err = c.Next()
		return
	}
	if err := c.Next(); err != nil {
		renderError(c, err) // so that idem records what the client sees
	}
	resp := c.Response()
	body, err := takeBody(resp)
	if err != nil {
		renderError(c, fiber.NewError(fiber.StatusInternalServerError, ErrBodyStream.Error()+": "+err.Error()))
		body, _ = takeBody(resp)
	}
	h := w.Header()
	clear(h)
	resp.Header.VisitAll(func(k, v []byte) {
		if key := http.CanonicalHeaderKey(string(k)); !skipHeader(key) {
			h[key] = append(h[key], string(v))
		}
	})
	w.WriteHeader(resp.StatusCode())
	if len(body) > 0 {
		_, _ = w.Write(body)
	}
}

// renderError answers err with the app's error handler, as fiber does at the
// end of the chain.
func renderError(c *fiber.Ctx, err error) {
	if catch := c.App().ErrorHandler(c, err); catch != nil {
		_ = c.SendStatus(fiber.StatusInternalServerError)
	}
}

// takeBody returns a copy of the response body, reading a body stream to its
// end, and empties the response's body.
func takeBody(resp *fasthttp.Response) ([]byte, error) {
	defer resp.ResetBody()
	if !resp.IsBodyStream() {
		return bytes.Clone(resp.Body()), nil
	}
	body, err := io.ReadAll(resp.BodyStream())
	if cerr := resp.CloseBodyStream(); err == nil {
		err = cerr
	}
	return body, err
}

// skipHeader reports whether a header describes the framing of a fasthttp
// message rather than the response: fasthttp sets those when it writes.
func skipHeader(key string) bool {
	return key == fiber.HeaderContentLength || key == fiber.HeaderTransferEncoding
}

// request converts the fasthttp request to a net/http one on ctx, keeping
// every header value and the raw body.
func request(c *fiber.Ctx, ctx context.Context) *http.Request {
	fr := c.Request()
	uri := string(fr.RequestURI())
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		u = &url.URL{Path: string(fr.URI().Path()), RawQuery: string(fr.URI().QueryString())}
	}
	body := fr.Body()
	r := &http.Request{
		Method:        c.Method(),
		URL:           u,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        make(http.Header),
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Host:          string(fr.Host()),
		RemoteAddr:    c.Context().RemoteAddr().String(),
		RequestURI:    uri,
	}
	if !fr.Header.IsHTTP11() {
		r.Proto, r.ProtoMinor = "HTTP/1.0", 0
	}
	fr.Header.VisitAll(func(k, v []byte) {
		key := http.CanonicalHeaderKey(string(k))
		if key != fiber.HeaderHost {
			r.Header[key] = append(r.Header[key], string(v))
		}
	})
	return r.WithContext(ctx)
}

// responseWriter is the http.ResponseWriter of idem's answer: it writes the
// status, headers and body into the fasthttp response. Its header map starts
// as the headers already set on the response (by middleware in front).
type responseWriter struct {
	resp   *fasthttp.Response
	header http.Header
	entry  http.Header // the headers at entry, for reset
	wrote  bool
}

func newResponseWriter(resp *fasthttp.Response) *responseWriter {
	w := &responseWriter{resp: resp, header: make(http.Header)}
	resp.Header.VisitAll(func(k, v []byte) {
		// Content-Type reads as fasthttp's default when unset: not kept.
		if key := http.CanonicalHeaderKey(string(k)); !skipHeader(key) && key != fiber.HeaderContentType {
			w.header[key] = append(w.header[key], string(v))
		}
	})
	w.entry = w.header.Clone()
	return w
}

// Header returns the header map of the answer.
func (w *responseWriter) Header() http.Header { return w.header }

// WriteHeader replaces the fasthttp response's status and headers with the
// answer's, once.
func (w *responseWriter) WriteHeader(code int) {
	if w.wrote {
		return
	}
	w.wrote = true
	w.set(code, w.header)
}

// Write appends p to the response body.
func (w *responseWriter) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	w.resp.AppendBody(p)
	return len(p), nil
}

// reset puts the response back as it was at entry.
func (w *responseWriter) reset() { w.set(http.StatusOK, w.entry) }

func (w *responseWriter) set(code int, header http.Header) {
	h := &w.resp.Header
	var keys []string
	h.VisitAll(func(k, _ []byte) { keys = append(keys, string(k)) })
	for _, k := range keys {
		h.Del(k)
	}
	for k, vs := range header {
		if skipHeader(k) {
			continue
		}
		for _, v := range vs {
			h.Add(k, v)
		}
	}
	w.resp.SetStatusCode(code)
	w.resp.ResetBody()
}
