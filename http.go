package idem

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultKeyHeader is the request header that carries the idempotency key,
// as named by the IETF draft "The Idempotency-Key HTTP Header Field".
const DefaultKeyHeader = "Idempotency-Key"

// ReplayedHeader is the response header, set to "true", that marks a replayed
// response (the name Stripe's client libraries read).
const ReplayedHeader = "Idempotent-Replayed"

const (
	defaultMaxRequestBody  = 1 << 20
	defaultMaxResponseBody = 1 << 20
	// problemBase is where the problem types are explained.
	problemBase = "https://github.com/idemkit/idem/blob/main/docs/http.md#"
)

// defaultStoredHeaders are the response headers stored and replayed unless
// WithStoredHeaders adds more.
var defaultStoredHeaders = []string{"Content-Type", "Location", "Content-Location", "Etag", "Last-Modified"}

// forbiddenStoredHeaders are never stored: credentials and cookies must not be
// handed to whoever repeats a key, and the framing headers belong to the
// connection that carries the replay.
var forbiddenStoredHeaders = []string{
	"Set-Cookie", "Set-Cookie2", "Authorization", "Proxy-Authorization", "Proxy-Authenticate", "Www-Authenticate",
	"Cookie", "Connection", "Keep-Alive", "Transfer-Encoding", "Content-Length", "Trailer", "Upgrade",
	ReplayedHeader,
}

// safeMethods never need a key; the middleware passes them through.
var safeMethods = []string{http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace}

// HTTPOption configures Guard.Middleware.
type HTTPOption func(*httpConfig)

type httpConfig struct {
	header      string
	methods     []string
	scope       func(*http.Request) string
	optional    bool
	cacheStatus func(code int) bool
	stored      []string
	maxRequest  int64
	maxResponse int
	errs        []string
}

func (c *httpConfig) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

// WithScope sets the function that returns the scope of a request's key: the
// tenant, account or principal that owns it. Records are keyed by scope and
// key, so equal keys sent by two scopes never meet. The default is one scope
// for everyone, which is only right when one client owns the whole API: in a
// multi-tenant API without a scope, a tenant that sends another tenant's key
// receives that tenant's stored response. The function runs after the key is
// validated and before the body is read; derive the scope from authenticated
// identity, never from a header the client may set freely.
func WithScope(f func(*http.Request) string) HTTPOption {
	return func(c *httpConfig) {
		if f == nil {
			c.fail("WithScope(nil)")
		}
		c.scope = f
	}
}

// WithMethods sets the methods that need a key; the default is POST and PATCH.
// Requests with other methods pass through without touching the store. Safe
// methods (GET, HEAD, OPTIONS, TRACE) are idempotent already and cannot be
// configured: Middleware panics.
func WithMethods(methods ...string) HTTPOption {
	return func(c *httpConfig) {
		if len(methods) == 0 {
			c.fail("WithMethods with no method")
		}
		for _, m := range methods {
			switch {
			case m == "" || strings.ContainsAny(m, " \t\r\n"):
				c.fail("WithMethods: invalid method %q", m)
			case slices.Contains(safeMethods, m):
				c.fail("WithMethods: %s is a safe method and needs no idempotency key", m)
			}
		}
		c.methods = append([]string(nil), methods...)
	}
}

// WithOptionalKey lets requests without a key through to the handler,
// unprotected. By default the key is required: a request of a configured
// method without one gets 400. A key that is present but invalid gets 400
// either way.
func WithOptionalKey() HTTPOption {
	return func(c *httpConfig) { c.optional = true }
}

// WithCacheStatus sets which responses are stored and replayed, by status
// code. A response that is not stored releases the key, so a retry runs the
// handler again (with Attempt.Fence one higher). The default stores every
// status except 5xx, 408, 409, 425 and 429, which say "try again".
func WithCacheStatus(f func(code int) bool) HTTPOption {
	return func(c *httpConfig) {
		if f == nil {
			c.fail("WithCacheStatus(nil)")
		}
		c.cacheStatus = f
	}
}

// DefaultCacheStatus is the default of WithCacheStatus: it reports whether a
// response with this status is stored, which is every status but 5xx, 408,
// 409, 425 and 429.
func DefaultCacheStatus(code int) bool {
	switch code {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return code < 500
}

// WithKeyHeader sets the request header that carries the key. The default is
// DefaultKeyHeader, Idempotency-Key.
func WithKeyHeader(name string) HTTPOption {
	return func(c *httpConfig) {
		if name == "" || strings.ContainsAny(name, " \t\r\n:") {
			c.fail("WithKeyHeader: invalid header name %q", name)
		}
		c.header = http.CanonicalHeaderKey(name)
	}
}

// WithStoredHeaders adds response headers to those stored and replayed.
// The default list is Content-Type, Location, Content-Location, ETag and
// Last-Modified. Set-Cookie, Authorization and the other credential and
// connection headers are never stored: naming one makes Middleware panic.
func WithStoredHeaders(names ...string) HTTPOption {
	return func(c *httpConfig) {
		for _, n := range names {
			n = http.CanonicalHeaderKey(n)
			switch {
			case n == "" || strings.ContainsAny(n, " \t\r\n:"):
				c.fail("WithStoredHeaders: invalid header name %q", n)
			case slices.Contains(forbiddenStoredHeaders, n):
				c.fail("WithStoredHeaders: %s is never stored", n)
			case !slices.Contains(c.stored, n):
				c.stored = append(c.stored, n)
			}
		}
	}
}

// WithMaxRequestBody sets the largest request body the middleware reads to
// fingerprint it; a larger one gets 413 and the handler does not run. The
// default is 1 MiB.
func WithMaxRequestBody(n int64) HTTPOption {
	return func(c *httpConfig) {
		if n <= 0 {
			c.fail("WithMaxRequestBody(%d): must be positive", n)
		}
		c.maxRequest = n
	}
}

// WithMaxResponseBody sets the largest response body that is stored. The
// default is 1 MiB. The middleware holds a response until its record is
// committed; a response that grows past the limit is sent to the client as it
// is written instead, and its record keeps only the status and the headers
// that do not describe the body (Location and those added by
// WithStoredHeaders). A repeat of the key does not run the handler again: it
// gets that status and those headers with a problem body saying that the
// response cannot be replayed (see docs/http.md). Zero stores no body at all.
func WithMaxResponseBody(n int) HTTPOption {
	return func(c *httpConfig) {
		if n < 0 {
			c.fail("WithMaxResponseBody(%d): must not be negative", n)
		}
		c.maxResponse = n
	}
}

type attemptContextKey struct{}

// AttemptFrom returns the Attempt of the operation that a request under
// Middleware is running, and reports whether there is one. Use Attempt.ID as
// the idempotency key towards external providers, and check Attempt.Fence
// before repeating a side effect.
func AttemptFrom(ctx context.Context) (*Attempt, bool) {
	a, ok := ctx.Value(attemptContextKey{}).(*Attempt)
	return a, ok
}

// Middleware returns HTTP middleware that runs each request carrying an
// idempotency key at most once, across every replica sharing g's store, and
// answers its repeats with the stored response. It follows the IETF draft
// "The Idempotency-Key HTTP Header Field"; docs/http.md is the contract to
// give to client developers.
//
// For a request whose method is configured (WithMethods; default POST and
// PATCH), the middleware reads the key from the Idempotency-Key header (a
// plain value or an RFC 8941 quoted string) and the body (up to
// WithMaxRequestBody), and fingerprints the request: method, path and query,
// and body, where a JSON body (by Content-Type) is canonicalised so that
// object key order and whitespace do not matter. Then:
//
//   - Missing key: 400 (or, with WithOptionalKey, the handler runs unprotected).
//   - Invalid key (empty, over 255 bytes, not printable ASCII): 400.
//   - Body too large: 413. Body unreadable: 400.
//   - First request: the handler runs once, with the Attempt in the request's
//     context (AttemptFrom). Its response is held until its record is
//     committed, then sent. Status, body and the allowlisted headers
//     (WithStoredHeaders) are stored unless WithCacheStatus says otherwise
//     (default: 5xx, 408, 409, 425 and 429 are not stored, and release the
//     key so that a retry runs the handler again).
//   - Repeat of a completed request: the stored response with
//     Idempotent-Replayed: true; the handler does not run.
//   - Repeat while the first still runs: 409 with Retry-After (whole seconds,
//     rounded up), or with WithWait the first response once it is ready.
//   - Same key, different fingerprint: 422.
//   - Store unreachable: 503 with Retry-After; the handler does not run.
//   - The handler ran but its record could not be written: the handler's own
//     response, without the replay header (the engine logs it at error level).
//   - The handler panics: the key is released and the panic continues.
//
// Errors are application/problem+json bodies (RFC 9457). The handler's
// context is detached from the client's connection: a client that goes away
// does not cancel the handler, so that its retry finds the outcome. The
// context keeps the request's values and is cancelled, with cause
// ErrLeaseLost, only if the lease is lost. A duplicate waiting under WithWait
// stops waiting when its own client goes away.
//
// The response writer the handler gets buffers the response; it supports
// http.Flusher (a no-op until the response is too large to store) and
// Unwrap for http.ResponseController, and refuses Hijack.
//
// Middleware panics on invalid options, at construction.
func (g *Guard) Middleware(opts ...HTTPOption) func(http.Handler) http.Handler {
	if g == nil {
		panic("idem: Middleware on a nil Guard")
	}
	c := httpConfig{
		header:      DefaultKeyHeader,
		methods:     []string{http.MethodPost, http.MethodPatch},
		cacheStatus: DefaultCacheStatus,
		stored:      slices.Clone(defaultStoredHeaders),
		maxRequest:  defaultMaxRequestBody,
		maxResponse: defaultMaxResponseBody,
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if len(c.errs) > 0 {
		panic("idem: Middleware: " + strings.Join(c.errs, "; "))
	}
	m := &middleware{g: g, httpConfig: c}
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic("idem: Middleware applied to a nil handler")
		}
		return &idemHandler{m: m, next: next}
	}
}

type middleware struct {
	g *Guard
	httpConfig
}

type idemHandler struct {
	m    *middleware
	next http.Handler
}

// ServeHTTP implements http.Handler.
func (h *idemHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m := h.m
	if !slices.Contains(m.methods, r.Method) {
		h.next.ServeHTTP(w, r)
		return
	}
	values := r.Header[m.header]
	if len(values) == 0 {
		if m.optional {
			h.next.ServeHTTP(w, r)
			return
		}
		writeProblem(w, &probKeyMissing, "The "+m.header+" header is missing. Create a unique key (a UUID) when the operation is created, send it with this request and reuse it on every retry of the same operation.")
		return
	}
	if len(values) > 1 {
		writeProblem(w, &probKeyInvalid, "The request has more than one "+m.header+" header; send exactly one.")
		return
	}
	key, err := parseKey(values[0])
	if err != nil {
		writeProblem(w, &probKeyInvalid, "The "+m.header+" header is invalid ("+strings.TrimPrefix(err.Error(), "idem: ")+"). Send 1 to 255 printable ASCII characters, plain or as a quoted string; a UUID is recommended.")
		return
	}
	var scope string
	if m.scope != nil {
		scope = m.scope(r)
	}

	// Read the body behind room for the fingerprint's prefix, so that a body
	// compared byte for byte is fingerprinted without a copy.
	path := r.URL.EscapedPath()
	prefix := len(r.Method) + len(path) + len(r.URL.RawQuery) + 4
	buf, status := readBody(r, m.maxRequest, prefix)
	switch status {
	case http.StatusRequestEntityTooLarge:
		writeProblem(w, &probBodyTooLarge, "The request body is larger than "+strconv.FormatInt(m.maxRequest, 10)+" bytes.")
		return
	case http.StatusBadRequest:
		writeProblem(w, &probBodyUnreadable, "The request body could not be read completely. Send the request again with the same key.")
		return
	}
	body := buf[prefix:]
	fp := requestPrint(r, path, buf, prefix)

	c := &call{}
	ran := false
	payload, replayed, err := m.g.exec(r.Context(), op{ns: nsHTTP, scope: scope, key: key, fp: fp, detach: true, wait: m.g.wait},
		func(ctx context.Context, a *Attempt) ([]byte, bool, error) {
			ran = true
			c.rec = recorder{w: w, names: m.stored, limit: m.maxResponse}
			c.body = bodyReader{b: body}
			c.ctx = attemptContext{Context: ctx, a: a}
			r2 := r.WithContext(&c.ctx)
			r2.Body = &c.body
			h.next.ServeHTTP(&c.rec, r2)
			return m.record(&c.rec)
		})
	switch {
	case replayed:
		m.replay(w, r, payload)
	case ran:
		// Committed, released (not stored), or not recorded: the engine
		// logged the last; the client gets the handler's own response.
		c.rec.send()
	default:
		m.refuse(w, r, err)
	}
}

// call is the state of one protected request, allocated once.
type call struct {
	ctx  attemptContext
	rec  recorder
	body bodyReader
}

// attemptContext carries the Attempt for AttemptFrom.
type attemptContext struct {
	context.Context
	a *Attempt
}

func (c *attemptContext) Value(key any) any {
	if key == (attemptContextKey{}) {
		return c.a
	}
	return c.Context.Value(key)
}

// record finishes the captured response and returns the payload to store,
// and whether to store it.
func (m *middleware) record(rec *recorder) ([]byte, bool, error) {
	rec.finish()
	if !m.cacheStatus(rec.code) {
		return nil, false, nil
	}
	if rec.streaming {
		return appendHead(nil, payloadTooLarge, rec.code, rec.snap, m.stored), true, nil
	}
	return rec.buf, true, nil
}

// refuse answers a request whose handler did not run.
func (m *middleware) refuse(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, ErrInProgress):
		retry := "1"
		if e, ok := errors.AsType[*InProgressError](err); ok {
			retry = retrySeconds(e.RetryAfter)
		}
		w.Header().Set("Retry-After", retry)
		writeProblem(w, &probInProgress, "A request with this key is still being processed. Retry after the number of seconds in Retry-After, with the same key; you will get its response.")
	case errors.Is(err, ErrMismatch):
		writeProblem(w, &probKeyReused, "This "+m.header+" was already used with a different request (method, path, query or body). Use a new key for a new operation; reuse a key only to retry exactly the same request.")
	case errors.Is(err, ErrInvalidKey):
		writeProblem(w, &probKeyInvalid, "The "+m.header+" header is invalid. Send 1 to 255 printable ASCII characters; a UUID is recommended.")
	default:
		if !errors.Is(err, ErrStoreUnavailable) {
			m.g.log.ErrorContext(r.Context(), "idem: request refused", "err", err)
		}
		w.Header().Set("Retry-After", "1")
		writeProblem(w, &probUnavailable, "The idempotency store is unreachable, so the request was not processed. Retry after the number of seconds in Retry-After, with the same key.")
	}
}

// replay answers a repeat with a stored response.
func (m *middleware) replay(w http.ResponseWriter, r *http.Request, payload []byte) {
	resp, err := decodeResponse(payload)
	if err != nil {
		m.g.log.ErrorContext(r.Context(), "idem: stored response does not decode", "err", err)
		writeProblem(w, &probStoredUnreadable, "This request was already processed, but its stored response cannot be read. Do not retry it; look up the outcome of the operation instead.")
		return
	}
	// One slice for all values and the replay marker.
	values := make([]string, len(resp.headers)+1)
	h := w.Header()
	for i := 0; i < len(resp.headers); {
		name := resp.headers[i].name
		j := i
		for ; j < len(resp.headers) && resp.headers[j].name == name; j++ {
			values[j] = resp.headers[j].value
		}
		h[name] = values[i:j:j]
		i = j
	}
	values[len(values)-1] = "true"
	h[ReplayedHeader] = values[len(values)-1:]
	if resp.tooLarge {
		p := problem{
			Type:   problemBase + "response-not-stored",
			Title:  "Response not stored",
			Status: resp.status,
			Detail: "This request was already processed (status " + strconv.Itoa(resp.status) + "), but its response was too large to store, so it cannot be replayed. Do not retry; look up the result (see Location, if present).",
		}
		h.Set("Content-Type", problemContentType)
		w.WriteHeader(resp.status)
		_, _ = w.Write(p.marshal())
		return
	}
	w.WriteHeader(resp.status)
	if len(resp.body) > 0 {
		_, _ = w.Write(resp.body)
	}
}

// retrySeconds renders d as whole seconds, rounded up, at least 1.
func retrySeconds(d time.Duration) string {
	s := math.Ceil(d.Seconds())
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(int64(s), 10)
}
