package idem

import (
	"context"
	"errors"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/internal/wire"
)

// Middleware returns HTTP middleware that runs each request carrying an
// idempotency key at most once, across every replica sharing g's store, and
// answers its repeats with the stored response. It follows the IETF draft
// "The Idempotency-Key HTTP Header Field"; docs/http.md is the contract to
// give to client developers.
//
// For a request whose method is configured (WithMethods; default POST and
// PATCH), the middleware reads the key from the Idempotency-Key header (a
// plain value or an RFC 8941 quoted string; another header with
// WithKeyHeader, or from the request by WithKeyFunc's function), the scope
// (WithScope) and the body (up to WithMaxRequestBody), and fingerprints the
// request: method, path and query, and body, where a JSON body (by
// Content-Type) is canonicalised so that object member order and whitespace
// do not matter (a body whose objects repeat a member name is compared byte
// for byte); WithFingerprint replaces the query and body with the bytes its
// function returns. Then:
//
//   - Missing key: 400 (or, with WithOptionalKey, the handler runs unprotected).
//   - Invalid key (empty, over 255 bytes, not printable ASCII): 400.
//   - WithKeyFunc's or WithFingerprint's function returns an error: 400.
//   - WithScope returned "": 500; the handler does not run (fail closed).
//   - Body too large: 413. Body unreadable: 400.
//   - First request: the handler runs once, with the Attempt in the request's
//     context (AttemptFrom). Its response is held until its record is
//     committed, then sent. Status, body and the allowlisted headers
//     (WithStoredHeaders) are stored unless WithCacheStatus says otherwise
//     (default: 5xx, 408, 409, 425 and 429 are not stored, and release the
//     key so that a retry runs the handler again). Trailers reach this
//     client only, as trailers; they are not stored.
//   - Repeat of a completed request: the stored response with
//     Idempotent-Replayed: true; the handler does not run.
//   - Repeat while the first still runs: after waiting up to the route's
//     wait (WithRouteWait; default the Guard's WithWait) for the first
//     response, 409 with Retry-After, a poll hint (WithRetryAfter, default
//     1s, capped by the first request's lease; whole seconds, rounded up).
//   - Same key, different fingerprint: 422.
//   - Store unreachable: 503 with Retry-After; the handler does not run.
//   - The handler ran but its record could not be written: the handler's own
//     response, without the replay header (the engine logs it at error level).
//   - The handler panics: the key is released (unless the handler called
//     Attempt.Abandon) and the panic continues.
//
// Errors are application/problem+json bodies (RFC 9457). The handler's
// context is detached from the client's connection: a client that goes away
// does not cancel the handler, so that its retry finds the outcome. The
// context keeps the request's values and is cancelled, with cause
// ErrLeaseLost, only if the lease is lost. A waiting duplicate stops waiting
// when its own client goes away.
//
// The response writer the handler gets buffers the response; it supports
// http.Flusher (a no-op until the response is too large to store) and
// Unwrap for http.ResponseController, and refuses Hijack.
//
// Of the Guard's options, WithLease, WithRetention (the default of
// WithRouteRetention), WithLogger, WithObserver, WithSealer and WithWait
// (the default of WithRouteWait) apply to the middleware; the others here
// are HTTPOptions. Middleware panics on invalid options, at construction.
func (g *Guard) Middleware(opts ...HTTPOption) func(http.Handler) http.Handler {
	if g == nil {
		panic("idem: Middleware on a nil Guard")
	}
	c := httpConfig{
		header:      DefaultKeyHeader,
		methods:     []string{http.MethodPost, http.MethodPatch},
		cacheStatus: defaultCacheStatus,
		stored:      slices.Clone(defaultStoredHeaders),
		maxRequest:  defaultMaxRequestBody,
		maxResponse: defaultMaxResponseBody,
		retryAfter:  defaultRetryAfter,
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.keyFunc != nil && c.headerSet {
		c.fail("WithKeyFunc and WithKeyHeader: the key is taken from one place; give one of them")
	}
	if len(c.errs) > 0 {
		panic("idem: Middleware: " + strings.Join(c.errs, "; "))
	}
	if !c.waitSet {
		c.wait = g.wait
	}
	m := &middleware{g: g, httpConfig: c, keyName: c.header}
	if c.keyFunc != nil {
		m.keyName = "idempotency key"
	}
	what := "method, path, query or body"
	if c.fingerprint != nil {
		what = "method, path, or the parts of it this route compares"
	}
	m.reusedDetail = "This " + m.keyName + " was already used with a different request (" + what + "). Use a new key for a new operation; reuse a key only to retry exactly the same request."
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
	keyName      string // what problems call the key: the header's name, or "idempotency key"
	reusedDetail string // the detail of the 422
}

type idemHandler struct {
	m    *middleware
	next http.Handler
}

// ServeHTTP implements http.Handler.
func (h *idemHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m := h.m
	if !m.protects(r.Method) {
		h.next.ServeHTTP(w, r)
		return
	}
	if m.keyFunc != nil {
		h.serveKeyFunc(w, r)
		return
	}
	values := r.Header[m.header]
	if len(values) == 0 && m.optional {
		h.next.ServeHTTP(w, r)
		return
	}
	ctx, ob := m.g.observe(r.Context(), KindHTTP)
	if ob != nil {
		r = r.WithContext(ctx)
		defer ob.abort()
	}
	key, ok := m.key(w, values)
	if !ok {
		ob.end(OutcomeInvalidKey, nil)
		return
	}
	scope, ok := m.scopeOf(w, r)
	if !ok {
		ob.end(OutcomeInvalidKey, nil)
		return
	}
	bp := bodyBuffers.get()
	body, fp, refused := m.readRequest(w, r, (*bp)[:0])
	if refused != "" {
		bodyBuffers.put(bp)
		ob.end(refused, nil)
		return
	}
	h.run(w, r, op{kind: KindHTTP, scope: scope, key: key, fp: fp, detach: true, wait: m.wait, retention: m.retention, obs: ob}, bp, body)
}

// run runs the handler of a request under o, at most once, with the body
// that the middleware read into the pooled buffer bp; it answers repeats
// with the stored response and refusals with a problem.
func (h *idemHandler) run(w http.ResponseWriter, r *http.Request, o op, bp *[]byte, body []byte) {
	m := h.m
	var c *call
	m.g.exec(r.Context(), o,
		func(ctx context.Context, a *Attempt) ([]byte, bool) {
			c = m.newCall(ctx, a, w, r, body)
			h.next.ServeHTTP(&c.rec, &c.req)
			return m.record(&c.rec)
		},
		func(out outcome, err error) (error, bool) {
			if c == nil || c.body.drained() {
				putBody(bp, body)
			}
			switch {
			case out.replayed:
				return err, !m.replay(w, r, out.payload)
			case out.ran:
				// Committed, released (not stored), or not recorded: the
				// engine logged the last; the client gets the handler's own
				// response.
				c.rec.send()
			default:
				m.refuse(w, r, err)
			}
			return err, false
		})
}

// protects reports whether requests with this method need a key. Methods
// are tokens, compared without regard to case.
func (m *middleware) protects(method string) bool {
	for _, p := range m.methods {
		if p == method || strings.EqualFold(p, method) {
			return true
		}
	}
	return false
}

// key returns the key in the key header's values, or answers with a problem.
func (m *middleware) key(w http.ResponseWriter, values []string) (string, bool) {
	switch len(values) {
	case 0:
		writeProblem(w, &probKeyMissing, "The "+m.header+" header is missing. Create a unique key (a UUID) when the operation is created, send it with this request and reuse it on every retry of the same operation.")
		return "", false
	case 1:
	default:
		writeProblem(w, &probKeyInvalid, "The request has more than one "+m.header+" header; send exactly one.")
		return "", false
	}
	key, err := wire.ParseKey(values[0])
	if err != nil {
		writeProblem(w, &probKeyInvalid, "The "+m.header+" header is invalid ("+strings.TrimPrefix(err.Error(), "idem: ")+"). Send 1 to 255 printable ASCII characters, plain or as a quoted string; a UUID is recommended.")
		return "", false
	}
	return key, true
}

// scopeOf returns the request's scope ("" without WithScope), or answers
// with a problem when WithScope returns "": falling back to the scope that
// everyone shares could replay another tenant's response.
func (m *middleware) scopeOf(w http.ResponseWriter, r *http.Request) (string, bool) {
	if m.scope == nil {
		return "", true
	}
	scope := m.scope(r)
	if scope == "" {
		m.g.log.ErrorContext(r.Context(), "idem: request refused: WithScope returned an empty scope; is authentication in front of the middleware?", "event", "scope_missing",
			"method", r.Method, "path", r.URL.Path)
		writeProblem(w, &probScopeMissing, "The server could not tell which account this request's "+m.keyName+" belongs to, so the request was not processed. This is a fault of the server; retrying will not help until it is fixed.")
		return "", false
	}
	return scope, true
}

// readRequest reads the body into buf and fingerprints the request, or
// answers with a problem and returns the outcome of the refusal.
func (m *middleware) readRequest(w http.ResponseWriter, r *http.Request, buf []byte) (body []byte, fp print128, refused Outcome) {
	body, status := readBody(r, m.maxRequest, buf)
	if refused = m.bodyRefused(w, status); refused != "" {
		return nil, print128{}, refused
	}
	if m.fingerprint != nil {
		fp, refused = m.customPrint(w, r, body)
		return body, fp, refused
	}
	return body, requestPrint(r, r.URL.EscapedPath(), body), ""
}

// call is the state of a request whose handler runs, allocated once: the
// recorder, the body, and the request and context the handler gets.
type call struct {
	rec  recorder
	body bodyReader
	actx attemptContext
	req  http.Request
}

// newCall prepares the run of the handler under ctx and a: r with that
// context and body.
func (m *middleware) newCall(ctx context.Context, a *Attempt, w http.ResponseWriter, r *http.Request, body []byte) *call {
	c := &call{
		rec:  recorder{w: w, limit: m.maxResponse, stored: m.stored},
		actx: attemptContext{Context: ctx, a: a},
	}
	c.body.b = body[:len(body):len(body)] // the pooled array's tail is not the handler's
	c.req = *r.WithContext(&c.actx)       // a copy in c, as WithContext makes one
	c.req.Body = &c.body
	return c
}

// attemptContext is ContextWithAttempt's context, held in the call rather
// than allocated apart.
type attemptContext struct {
	context.Context
	a *Attempt
}

func (c *attemptContext) Value(key any) any {
	if _, ok := key.(attemptContextKey); ok {
		return c.a
	}
	return c.Context.Value(key)
}

// record finishes the captured response and returns the payload to store,
// and whether to store it.
func (m *middleware) record(rec *recorder) ([]byte, bool) {
	rec.finish()
	if !m.cacheStatus(rec.code) {
		return nil, false
	}
	return rec.payload(), true
}

// refuse answers a request whose handler did not run.
func (m *middleware) refuse(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, ErrInProgress):
		// A poll hint, not the lease: the first request usually ends long
		// before its lease would.
		retry := m.retryAfter
		if e, ok := errors.AsType[*InProgressError](err); ok {
			retry = min(retry, e.RetryAfter)
		}
		w.Header().Set("Retry-After", retrySeconds(retry))
		writeProblem(w, &probInProgress, "A request with this key is still being processed. Retry after the number of seconds in Retry-After, with the same key; you will get its response.")
	case errors.Is(err, ErrMismatch):
		writeProblem(w, &probKeyReused, m.reusedDetail)
	case errors.Is(err, ErrInvalidKey):
		writeProblem(w, &probKeyInvalid, "The "+m.keyName+" is invalid. Send 1 to 255 printable ASCII characters; a UUID is recommended.")
	case errors.Is(err, ErrUnreadable): // logged by the engine, with the key id
		writeProblem(w, &probStoredUnreadable, storedUnreadableDetail)
	default:
		// A duplicate whose client left while it waited is no fault.
		if !errors.Is(err, ErrStoreUnavailable) && r.Context().Err() == nil {
			m.g.log.ErrorContext(r.Context(), "idem: request refused", "event", "request_refused", "err", err)
		}
		w.Header().Set("Retry-After", "1")
		writeProblem(w, &probUnavailable, "The idempotency store did not answer in time, so the request was not processed. Retry after the number of seconds in Retry-After, with the same key: it runs then, once.")
	}
}

// replay answers a repeat with a stored response, and reports whether it
// could be read.
func (m *middleware) replay(w http.ResponseWriter, r *http.Request, payload []byte) bool {
	resp, err := parseHead(payload)
	if err != nil {
		m.g.log.ErrorContext(r.Context(), "idem: stored response does not decode", "event", "stored_response_unreadable", "err", err)
		writeProblem(w, &probStoredUnreadable, "This request was already processed, but its stored response cannot be read. Do not retry it; look up the outcome of the operation instead.")
		return false
	}
	// The values of a name are stored together: each name gets its run of
	// one array, which ends with the replay header's value.
	h := w.Header()
	values := make([]string, resp.count+1)
	s, i, start := resp.text(payload), resp.first, 0
	var name string
	for k := range resp.count {
		var n string
		n, values[k], i = nextHeader(payload, s, i)
		if k > start && n != name {
			h[name] = values[start:k:k]
			start = k
		}
		name = n
	}
	if resp.count > 0 {
		h[name] = values[start:resp.count:resp.count]
	}
	values[resp.count] = "true"
	h[ReplayedHeader] = values[resp.count:]
	if resp.tooLarge {
		p := problem{
			Type:   problemBase + "response-not-stored",
			Title:  "Response not stored",
			Status: resp.status,
			Detail: "This request was already processed (status " + strconv.Itoa(resp.status) + "), but its response was too large to store, so it cannot be replayed. Do not retry; look up the result (see Location, if present).",
		}
		h.Set("Content-Type", wire.ProblemContentType)
		w.WriteHeader(resp.status)
		_, _ = w.Write(p.marshal())
		return true
	}
	w.WriteHeader(resp.status)
	if body := payload[resp.end:]; len(body) > 0 {
		_, _ = w.Write(body)
	}
	return true
}

// retrySeconds renders d as whole seconds, rounded up, at least 1.
func retrySeconds(d time.Duration) string {
	return strconv.FormatInt(int64(max(math.Ceil(d.Seconds()), 1)), 10)
}
