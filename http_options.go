package idem

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem/internal/wire"
)

const (
	defaultMaxRequestBody  = 1 << 20
	defaultMaxResponseBody = 1 << 20
	defaultRetryAfter      = time.Second
)

// defaultStoredHeaders are the response headers stored and replayed unless
// WithStoredHeaders adds more: those that describe the body (how to decode,
// display and cache it), and where the result lives.
var defaultStoredHeaders = []string{
	"Content-Type", "Location", "Content-Location", "Etag", "Last-Modified",
	"Content-Encoding", "Content-Language", "Content-Disposition", "Content-Range", "Vary", "Cache-Control",
}

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

// DefaultKeyHeader is the request header that carries the idempotency key,
// as named by the IETF draft "The Idempotency-Key HTTP Header Field".
const DefaultKeyHeader = wire.KeyHeader

// ReplayedHeader is the response header, set to "true", that marks a replayed
// response (the name Stripe's client libraries read).
const ReplayedHeader = wire.ReplayedHeader

// HTTPOption configures Guard.Middleware.
type HTTPOption func(*httpConfig)

type httpConfig struct {
	header      string
	headerSet   bool // WithKeyHeader was given
	keyFunc     func(r *http.Request, body []byte) (string, error)
	fingerprint func(r *http.Request, body []byte) ([]byte, error)
	methods     []string
	scope       func(*http.Request) string
	optional    bool
	cacheStatus func(code int) bool
	stored      []string
	maxRequest  int64
	maxResponse int
	retryAfter  time.Duration
	wait        time.Duration
	waitSet     bool          // WithRouteWait was given; else the Guard's wait
	retention   time.Duration // WithRouteRetention; 0: the Guard's
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
// validated and before the body is read (after, with WithKeyFunc); derive the
// scope from authenticated identity, never from a header the client may set
// freely.
//
// A scope function that returns "" fails closed: such a request (typically
// one that the authentication in front of the middleware let through
// without an identity) gets 500 with a problem of type
// docs/http.md#scope-missing, the handler does not run, the store is not
// asked, and the middleware logs the event at error level. It never falls
// back to the scope that requests without WithScope share.
func WithScope(f func(*http.Request) string) HTTPOption {
	return func(c *httpConfig) {
		if f == nil {
			c.fail("WithScope(nil)")
		}
		c.scope = f
	}
}

// WithMethods sets the methods that need a key; the default is POST and PATCH.
// Methods are HTTP tokens (RFC 9110), upper-cased here; a request's method
// matches without regard to case. Requests with other methods pass through
// without touching the store. Safe methods (GET, HEAD, OPTIONS, TRACE) are
// idempotent already and cannot be configured: Middleware panics, as it does
// for a method that is not a token.
func WithMethods(methods ...string) HTTPOption {
	return func(c *httpConfig) {
		if len(methods) == 0 {
			c.fail("WithMethods with no method")
		}
		c.methods = c.methods[:0:0]
		for _, m := range methods {
			upper := strings.ToUpper(m)
			switch {
			case !wire.IsToken(m):
				c.fail("WithMethods: %q is not an HTTP method (RFC 9110 token)", m)
			case slices.Contains(safeMethods, upper):
				c.fail("WithMethods: %s is a safe method and needs no idempotency key", upper)
			case !slices.Contains(c.methods, upper):
				c.methods = append(c.methods, upper)
			}
		}
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

// defaultCacheStatus is the default of WithCacheStatus: it reports whether a
// response with this status is stored, which is every status but 5xx, 408,
// 409, 425 and 429.
func defaultCacheStatus(code int) bool {
	switch code {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return code < 500
}

// WithKeyHeader sets the request header that carries the key. The default is
// DefaultKeyHeader, Idempotency-Key. A webhook receiver names its sender's
// delivery header: "webhook-id" (Standard Webhooks, Svix),
// "X-GitHub-Delivery", "X-Shopify-Webhook-Id". It cannot be combined with
// WithKeyFunc: Middleware panics when both are given.
func WithKeyHeader(name string) HTTPOption {
	return func(c *httpConfig) {
		if !wire.IsToken(name) {
			c.fail("WithKeyHeader: invalid header name %q", name)
		}
		c.header, c.headerSet = http.CanonicalHeaderKey(name), true
	}
}

// WithStoredHeaders adds response headers to those stored and replayed.
// The default list holds the headers that describe the body or the result:
// Content-Type, Content-Encoding, Content-Language, Content-Disposition,
// Content-Range, Content-Location, ETag, Last-Modified, Vary, Cache-Control
// and Location. Set-Cookie, Authorization and the other credential and
// connection headers are never stored: naming one makes Middleware panic.
//
// What is stored per request, for the retention (the Guard's, or
// WithRouteRetention's): the status, the values of these headers, and the
// body up to WithMaxResponseBody; besides, the request's fingerprint (a
// hash, never the request). Keep it to what a retry needs: add no header
// the client can do without, answer with an id and a Location and let the
// client GET the details, and seal what is stored (WithSealer) when it holds
// customer data (Location can carry ids).
func WithStoredHeaders(names ...string) HTTPOption {
	return func(c *httpConfig) {
		for _, n := range names {
			n = http.CanonicalHeaderKey(n)
			switch {
			case !wire.IsToken(n):
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
// default is 1 MiB. The buffer grows with the bytes that arrive, whatever
// Content-Length announces.
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
// response cannot be replayed (see docs/http.md). Zero stores no body at all:
// the smallest record, for routes whose clients need only the status and
// Location on a retry. See WithStoredHeaders for what is stored per request.
func WithMaxResponseBody(n int) HTTPOption {
	return func(c *httpConfig) {
		if n < 0 {
			c.fail("WithMaxResponseBody(%d): must not be negative", n)
		}
		c.maxResponse = n
	}
}

// WithRetryAfter sets the Retry-After of the 409 that a duplicate gets while
// the first request with its key still runs: how soon to poll again. It is
// capped by the time left on the first request's lease and sent in whole
// seconds, rounded up, at least 1. The default is 1s, so that a client
// retrying a double click gets the first response about a second later,
// not when the lease would run out. A duration that is not positive makes
// Middleware panic.
func WithRetryAfter(d time.Duration) HTTPOption {
	return func(c *httpConfig) {
		if d <= 0 {
			c.fail("WithRetryAfter(%v): must be positive", d)
		}
		c.retryAfter = d
	}
}

// WithRouteWait sets how long a duplicate that arrives while the first
// request with its key runs waits for that request's response, on the
// routes of this middleware, before it gets 409; zero does not wait. The
// default is the Guard's WithWait. It lets one Guard serve routes that
// wait (a payment form that users double-click) and routes that answer at
// once. A negative duration makes Middleware panic.
func WithRouteWait(d time.Duration) HTTPOption {
	return func(c *httpConfig) {
		if d < 0 {
			c.fail("WithRouteWait(%v): must not be negative", d)
		}
		c.wait, c.waitSet = d, true
	}
}

// WithRouteRetention sets how long the records of this middleware's routes
// are kept and replayed: d instead of the Guard's WithRetention. The lease
// rules are unchanged: an unfinished record lives at most the lease plus d
// after its last claim, a completed one d. Use it to keep a route's stored
// responses no longer than the rules for its data allow (an hour for a
// route whose responses hold card data, while the others keep 24h), and
// longer than its clients retry. A duration that is not positive makes
// Middleware panic.
func WithRouteRetention(d time.Duration) HTTPOption {
	return func(c *httpConfig) {
		if d <= 0 {
			c.fail("WithRouteRetention(%v): must be positive", d)
		}
		c.retention = d
	}
}
