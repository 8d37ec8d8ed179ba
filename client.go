package idem

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// NewKey returns a new idempotency key: a random UUID (version 4, 122 bits
// from crypto/rand) in its 36-character text form. Create one when the
// user's intent is created (the Pay button is shown, the form is opened), keep
// it with the intent, and send it on every retry of that intent.
func NewKey() string {
	var u [16]byte
	rand.Read(u[:])         // never fails; crashes the program if the system has no randomness
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:], u[10:])
	return string(s[:])
}

type keyContextKey struct{}

// WithKey returns a copy of ctx carrying key, the idempotency key that a
// transport made by NewTransport sends with a request made with that context.
// Use it to keep one key across calls that are retries of one intent (the app
// restarted, the user pressed Pay again).
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContextKey{}, key)
}

// keyFrom returns the key set by WithKey.
func keyFrom(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyContextKey{}).(string)
	return k, ok
}

// TransportOption configures NewTransport.
type TransportOption func(*transport)

// WithRetryMethods sets the methods the transport gives a key and retries;
// other requests pass through untouched. The default is POST and PATCH.
func WithRetryMethods(methods ...string) TransportOption {
	return func(t *transport) { t.methods = append([]string(nil), methods...) }
}

// WithMaxAttempts sets how many times one request is sent at most, the first
// time included. The default is 5; values below 1 mean 1 (no retry).
func WithMaxAttempts(n int) TransportOption {
	return func(t *transport) { t.attempts = max(n, 1) }
}

// WithBackoff sets the exponential backoff between attempts when the server
// gives no Retry-After: before retry n the transport sleeps a random duration
// between 0 and min(limit, base·2ⁿ⁻¹) ("full jitter"). The defaults are 200ms
// and 10s; a base of zero or less keeps the default base, and a limit below
// the base is raised to it.
func WithBackoff(base, limit time.Duration) TransportOption {
	return func(t *transport) {
		if base > 0 {
			t.backoff = base
		}
		t.backoffCap = limit
	}
}

// WithMaxRetryAfter sets the longest Retry-After the transport waits for.
// A response asking for a longer wait is returned to the caller as it is,
// without a retry. The default is 30s; a negative value means 0.
func WithMaxRetryAfter(d time.Duration) TransportOption {
	return func(t *transport) { t.maxRetryAfter = max(d, 0) }
}

// WithTransportKeyHeader sets the request header that carries the key. The
// default is Idempotency-Key; match the server's WithKeyHeader.
func WithTransportKeyHeader(name string) TransportOption {
	return func(t *transport) { t.header = http.CanonicalHeaderKey(name) }
}

const (
	defaultAttempts      = 5
	defaultBackoff       = 200 * time.Millisecond
	defaultBackoffCap    = 10 * time.Second
	defaultMaxRetryAfter = 30 * time.Second
	// maxBufferedBody is the largest body without GetBody that the transport
	// buffers to be able to send it again.
	maxBufferedBody = 1 << 20
	// maxDrain is how much of a retried response's body is read so that its
	// connection can be reused.
	maxDrain = 64 << 10
)

type transport struct {
	base          http.RoundTripper
	header        string
	methods       []string
	attempts      int
	backoff       time.Duration
	backoffCap    time.Duration
	maxRetryAfter time.Duration

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
// one, else the key set by WithKey on the request's context, else a new key
// made by NewKey for this call. The key is sent as an RFC 8941 string
// ("quoted"), as the IETF draft specifies. Then it retries, always with the
// same key, when the attempt fails with a network error or gets 409
// (in progress), 429 (too many requests) or 503 (unavailable), up to
// WithMaxAttempts (default 5) attempts:
//
//   - When the response has Retry-After (seconds or an HTTP date), it waits
//     that long; when that is longer than WithMaxRetryAfter (default 30s),
//     it returns the response instead.
//   - Otherwise it waits a random time up to an exponentially growing limit
//     (WithBackoff).
//   - It stops when the request's context ends, returning the context's
//     error.
//
// The last attempt's response or error is returned. The body is sent again
// from Request.GetBody (set by http.NewRequest for bytes, strings and their
// readers); a body without GetBody is buffered in memory when at most 1 MiB,
// and a larger one is sent only once, without retries. Requests of other
// methods pass through unchanged. The transport never changes the caller's
// request.
func NewTransport(base http.RoundTripper, opts ...TransportOption) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	t := &transport{
		base:          base,
		header:        DefaultKeyHeader,
		methods:       []string{http.MethodPost, http.MethodPatch},
		attempts:      defaultAttempts,
		backoff:       defaultBackoff,
		backoffCap:    defaultBackoffCap,
		maxRetryAfter: defaultMaxRetryAfter,
		sleep:         sleepCtx,
		now:           time.Now,
		jitter:        mrand.Int64N,
	}
	for _, o := range opts {
		if o != nil {
			o(t)
		}
	}
	t.backoffCap = max(t.backoffCap, t.backoff)
	return t
}

// RoundTrip implements http.RoundTripper.
func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !slices.Contains(t.methods, req.Method) {
		return t.base.RoundTrip(req)
	}
	ctx := req.Context()
	value := req.Header.Get(t.header)
	if value == "" {
		key, ok := keyFrom(ctx)
		if !ok {
			key = NewKey()
		}
		if err := validKey(key); err != nil {
			closeBody(req)
			return nil, err
		}
		value = quoteKey(key)
	}

	getBody, retryable, err := bodySource(req)
	if err != nil {
		return nil, err
	}
	attempts := t.attempts
	if !retryable {
		attempts = 1
	}
	for attempt := 1; ; attempt++ {
		r := req.Clone(ctx)
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
		if attempt >= attempts || ctx.Err() != nil {
			return resp, err
		}
		var wait time.Duration
		if err == nil {
			if !retryStatus(resp.StatusCode) {
				return resp, nil
			}
			if d, ok := retryAfter(resp.Header.Get("Retry-After"), t.now()); ok {
				if d > t.maxRetryAfter {
					return resp, nil
				}
				wait = d
			} else {
				wait = t.backoffFor(attempt)
			}
			_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
			resp.Body.Close()
		} else {
			wait = t.backoffFor(attempt)
		}
		if err := t.sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// backoffFor returns the full-jitter backoff before retry number attempt:
// uniform in [0, min(cap, base·2^(attempt-1))).
func (t *transport) backoffFor(attempt int) time.Duration {
	limit := t.backoffCap
	if shift := attempt - 1; shift < 32 && t.backoff<<shift < limit && t.backoff<<shift > 0 {
		limit = t.backoff << shift
	}
	if limit <= 0 {
		return 0
	}
	return time.Duration(t.jitter(int64(limit)))
}

// retryStatus reports whether a response with this status is retried: the
// operation is in progress (409), the client is throttled (429) or the
// server (or its store) is unavailable (503).
func retryStatus(code int) bool {
	return code == http.StatusConflict || code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable
}

// retryAfter parses a Retry-After value: delay-seconds or an HTTP date.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(n) * time.Second, true
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(at.Sub(now), 0), true
	}
	return 0, false
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

// quoteKey returns key as an RFC 8941 string: in double quotes, with
// backslash and double quote escaped.
func quoteKey(key string) string {
	if !strings.ContainsAny(key, `"\`) {
		return `"` + key + `"`
	}
	var b strings.Builder
	b.Grow(len(key) + 4)
	b.WriteByte('"')
	for i := 0; i < len(key); i++ {
		if c := key[i]; c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(key[i])
	}
	b.WriteByte('"')
	return b.String()
}

// sleepCtx sleeps for d or until ctx ends, returning the context's error.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
