package idemclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem/internal/wire"
)

// Option configures NewTransport.
type Option func(*transportConfig)

type transportConfig struct {
	header        string
	methods       []string
	attempts      int
	backoff       time.Duration
	backoffCap    time.Duration
	maxRetryAfter time.Duration
	bare          bool
	errs          []string
}

func (c *transportConfig) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

// WithRetryMethods sets the methods the transport gives a key and retries;
// other requests pass through untouched. The default is POST and PATCH.
// Methods are upper-cased. No method, or a method that is not an HTTP token
// (RFC 9110), makes NewTransport panic.
func WithRetryMethods(methods ...string) Option {
	return func(c *transportConfig) {
		if len(methods) == 0 {
			c.fail("WithRetryMethods with no method")
		}
		c.methods = c.methods[:0:0]
		for _, m := range methods {
			if !wire.IsToken(m) {
				c.fail("WithRetryMethods: invalid method %q", m)
				continue
			}
			if m = strings.ToUpper(m); !slices.Contains(c.methods, m) {
				c.methods = append(c.methods, m)
			}
		}
	}
}

// WithMaxAttempts sets how many times one request is sent at most, the first
// time included. The default is 5; values below 1 mean 1 (no retry).
func WithMaxAttempts(n int) Option {
	return func(c *transportConfig) { c.attempts = max(n, 1) }
}

// WithBackoff sets the exponential backoff between attempts when the server
// gives no Retry-After: before retry n the transport sleeps a random duration
// between 0 and min(limit, base·2ⁿ⁻¹) ("full jitter"). The defaults are 200ms
// and 10s; a base of zero or less keeps the default base, and a limit below
// the base is raised to it.
func WithBackoff(base, limit time.Duration) Option {
	return func(c *transportConfig) {
		if base > 0 {
			c.backoff = base
		}
		c.backoffCap = limit
	}
}

// WithMaxRetryAfter sets the longest Retry-After the transport waits for.
// A response asking for a longer wait (however long: a number of seconds too
// large for any integer type or a date centuries ahead counts) is returned to
// the caller at once, as it is, without a retry. The default is 30s; a
// negative value means 0.
func WithMaxRetryAfter(d time.Duration) Option {
	return func(c *transportConfig) { c.maxRetryAfter = max(d, 0) }
}

// WithKeyHeader sets the request header that carries the key. The default
// is Idempotency-Key; match the server's (idem.WithKeyHeader). A name that is
// not an HTTP token (empty, with spaces, a colon or non-ASCII bytes) makes
// NewTransport panic.
func WithKeyHeader(name string) Option {
	return func(c *transportConfig) {
		if !wire.IsToken(name) {
			c.fail("WithKeyHeader: invalid header name %q", name)
		}
		c.header = http.CanonicalHeaderKey(name)
	}
}

// WithBareKey makes the transport send the keys it sets (from WithKey or
// NewKey) bare, as they are, instead of as an RFC 8941 string in double
// quotes, for third-party APIs that expect a bare key. idem's middleware
// accepts both forms as the same key. A key that cannot travel bare (one that
// starts with a double quote, or starts or ends with a space) is refused with
// ErrInvalidKey; a request's own header is sent as it is either way. The
// default is quoted, as the IETF draft specifies.
func WithBareKey() Option {
	return func(c *transportConfig) { c.bare = true }
}

const (
	defaultAttempts      = 5
	defaultBackoff       = 200 * time.Millisecond
	defaultBackoffCap    = 10 * time.Second
	defaultMaxRetryAfter = 30 * time.Second
	// maxBufferedBody is the largest body without GetBody that the transport
	// buffers to be able to send it again.
	maxBufferedBody = 1 << 20
)

type transport struct {
	transportConfig
	base http.RoundTripper

	// Replaced by tests.
	sleep  func(ctx context.Context, d time.Duration) error
	now    func() time.Time
	jitter func(n int64) int64 // uniform in [0, n)
}

// NewTransport returns a RoundTripper that makes requests safe to retry and
// retries them. It wraps base (http.DefaultTransport when nil).
//
// For a request whose method is configured (WithRetryMethods; default POST
// and PATCH) it sends the idempotency key: the request's own header if it has
// one (sent as it is), else the key set by WithKey on the request's context,
// else a new key made by NewKey for this call. The key is sent as an RFC 8941
// string ("quoted"), as the IETF draft specifies, or bare with WithBareKey.
// Each attempt sends a copy of the request whose context carries the key as
// created (unquoted) and whose header carries it as sent, and the response's
// Request is that copy: idemclient.KeyFrom(resp.Request.Context()) returns
// the key that was used, and resp.Request.Header.Get("Idempotency-Key") its
// header value (quoted, "abc", unless WithBareKey or the request's own
// header says otherwise). Then it retries, always with the same key, up to
// WithMaxAttempts (default 5) attempts, when the attempt fails with a network
// error or gets:
//
//   - 409 with idem's in-progress problem (application/problem+json whose type
//     is docs/http.md#in-progress): the first request with this key is still
//     running. Any other 409 (a handler's own "account frozen") is the
//     server's final answer and is returned at once, its body intact.
//   - 429 (too many requests) or 503 (unavailable).
//
// When the response has Retry-After (seconds or an HTTP date), it waits that
// long; when that is longer than WithMaxRetryAfter (default 30s), it returns
// the response at once instead. Otherwise it waits a random time up to an
// exponentially growing limit (WithBackoff). It stops when the request's
// context ends, returning the context's error. The last attempt's response or
// error is returned; a response whose base left Body nil gets http.NoBody.
//
// Retries outside the transport: a library that retries by calling RoundTrip
// again (go-retryablehttp, resty, a loop of client.Do) starts a new logical
// request each time, and without a key of the caller's each one gets a new
// key, so a first attempt whose answer was lost is run again by the server.
// A caller that retries on its own must create the key with NewKey when the
// intent is created and pass it with WithKey on the request's context (or as
// the request's header) on every attempt; see the example with
// go-retryablehttp. Reading the key with KeyFrom(resp.Request.Context())
// and sending it again works too, but a failed attempt has no response to
// read it from.
//
// The body is sent again from Request.GetBody (set by http.NewRequest for
// bytes, strings and their readers); a body without GetBody is buffered in
// memory when at most 1 MiB, and a larger one is sent only once, without
// retries. Requests of other methods pass through unchanged. The transport
// never changes the caller's request.
//
// NewTransport panics on invalid options (a malformed header name or
// method); out-of-range numbers and durations are clamped, as each option
// says.
func NewTransport(base http.RoundTripper, opts ...Option) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	c := transportConfig{
		header:        wire.KeyHeader,
		methods:       []string{http.MethodPost, http.MethodPatch},
		attempts:      defaultAttempts,
		backoff:       defaultBackoff,
		backoffCap:    defaultBackoffCap,
		maxRetryAfter: defaultMaxRetryAfter,
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if len(c.errs) > 0 {
		panic("idem: NewTransport: " + strings.Join(c.errs, "; "))
	}
	c.backoffCap = max(c.backoffCap, c.backoff)
	return &transport{transportConfig: c, base: base, sleep: sleepCtx, now: time.Now, jitter: mrand.Int64N}
}

// RoundTrip implements http.RoundTripper.
func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !slices.Contains(t.methods, req.Method) {
		return t.base.RoundTrip(req)
	}
	ctx := req.Context()
	value, key, err := t.keyValue(req)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	getBody, retryable, err := bodySource(req)
	if err != nil {
		return nil, err
	}
	attempts := t.attempts
	if !retryable {
		attempts = 1
	}
	sendCtx := ctx // carries the key as created, for KeyFrom(resp.Request.Context())
	if k, ok := KeyFrom(ctx); !ok || k != key {
		sendCtx = WithKey(ctx, key)
	}
	for attempt := 1; ; attempt++ {
		r := req.Clone(sendCtx)
		r.Header.Set(t.header, value)
		if getBody != nil {
			if r.Body, err = getBody(); err != nil {
				return nil, fmt.Errorf("idem: getting the request body again: %w", err)
			}
			r.GetBody = nil
			if retryable {
				r.GetBody = getBody
			}
		}
		resp, err := t.base.RoundTrip(r)
		if resp != nil {
			if resp.Body == nil {
				resp.Body = http.NoBody
			}
			if resp.Request == nil {
				resp.Request = r // so that the caller sees the key
			}
		}
		if attempt >= attempts || ctx.Err() != nil {
			return resp, err
		}
		wait, retry := t.retryWait(resp, err, attempt)
		if !retry {
			return resp, nil
		}
		if err := t.sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// keyValue returns the header value that carries the request's key, and
// the key as created: the request's own header, read as the middleware
// reads it (unquoted; as it is when it is no valid key), or the key from
// WithKey or NewKey.
func (t *transport) keyValue(req *http.Request) (value, key string, err error) {
	if v := req.Header.Get(t.header); v != "" {
		if key, err := wire.ParseKey(v); err == nil {
			return v, key, nil
		}
		return v, v, nil
	}
	key, ok := KeyFrom(req.Context())
	if !ok {
		key = NewKey()
	}
	if err := wire.ValidKey(key); err != nil {
		return "", "", err
	}
	if !t.bare {
		return wire.QuoteKey(key), key, nil
	}
	if key[0] == '"' || key[0] == ' ' || key[len(key)-1] == ' ' {
		return "", "", fmt.Errorf("%w: %q cannot be sent bare: it starts with a double quote, or starts or ends with a space", ErrInvalidKey, key)
	}
	return key, key, nil
}

// bodySource returns how to get the request body for every attempt, and
// whether the request may be sent more than once. A nil getBody means the
// request has no body.
func bodySource(req *http.Request) (getBody func() (io.ReadCloser, error), retryable bool, err error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, true, nil
	}
	if req.GetBody != nil {
		// The first attempt reads the caller's body, later ones fresh copies.
		first := true
		return func() (io.ReadCloser, error) {
			if first {
				first = false
				return req.Body, nil
			}
			return req.GetBody()
		}, true, nil
	}
	b, err := io.ReadAll(io.LimitReader(req.Body, maxBufferedBody+1))
	if err != nil {
		req.Body.Close()
		return nil, false, fmt.Errorf("idem: reading the request body: %w", err)
	}
	if len(b) > maxBufferedBody {
		// Too large to keep: send what was read and the rest, once.
		rest := req.Body
		first := true
		return func() (io.ReadCloser, error) {
			if !first {
				return nil, errors.New("idem: request body larger than 1 MiB has no GetBody")
			}
			first = false
			return struct {
				io.Reader
				io.Closer
			}{io.MultiReader(bytes.NewReader(b), rest), rest}, nil
		}, false, nil
	}
	req.Body.Close()
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }, true, nil
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}
