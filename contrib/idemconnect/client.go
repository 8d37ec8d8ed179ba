package idemconnect

import (
	"context"
	"errors"
	"fmt"
	"maps"
	mrand "math/rand/v2"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/idemkit/idem/idemclient"
)

const (
	defaultAttempts   = 5
	defaultBackoff    = 200 * time.Millisecond
	defaultBackoffCap = 10 * time.Second
	// maxRetryDelay is the longest RetryInfo delay the client waits for; an
	// error asking for more is returned at once.
	maxRetryDelay = 30 * time.Second
)

// ClientOption configures NewClientInterceptor.
type ClientOption func(*clientConfig)

type clientConfig struct {
	attempts int
	backoff  backoff
}

// WithMaxAttempts sets how many times one call is sent at most, the first
// time included. The default is 5; values below 1 mean 1 (no retry).
func WithMaxAttempts(n int) ClientOption {
	return func(c *clientConfig) { c.attempts = max(n, 1) }
}

// WithBackoff sets the exponential backoff between attempts when the error
// carries no errdetails.RetryInfo: before retry n the client sleeps a random
// duration between 0 and min(limit, base·2ⁿ⁻¹) ("full jitter"). The defaults
// are 200ms and 10s; a base of zero or less keeps the default base, and a
// limit below the base is raised to it.
func WithBackoff(base, limit time.Duration) ClientOption {
	return func(c *clientConfig) {
		if base > 0 {
			c.backoff.base = base
		}
		c.backoff.limit = limit
	}
}

// ClientInterceptor is a connect.Interceptor for clients that sends an
// idempotency key with each unary call and retries with it; see
// NewClientInterceptor.
type ClientInterceptor struct {
	clientConfig
}

var _ connect.Interceptor = (*ClientInterceptor)(nil)

// NewClientInterceptor returns an interceptor that makes unary calls safe to
// retry and retries them. Pass it to clients with connect.WithInterceptors.
//
// Each call carries an idempotency key in its KeyHeader header: the call's
// own, when its request (or its connect.CallInfo) already has one, sent as
// it is; else the key set by idemclient.WithKey on the call's context; else a new
// key made by idemclient.NewKey for this call. A key from the context that is not
// 1 to 255 bytes of printable ASCII fails the call with CodeInvalidArgument,
// at once; the error also matches idem.ErrInvalidKey under errors.Is.
//
// Then it retries the call, always with the same key and the same request
// headers, up to WithMaxAttempts (default 5) attempts, when the call fails
// with CodeUnavailable, or with CodeAborted carrying an errdetails.RetryInfo
// (a server under idem answers so while the first call with the key still
// runs). It waits for the RetryInfo delay when the error carries one,
// returning the error at once when that is longer than 30s or than the time
// left before the call's deadline; otherwise it waits a random time up to an
// exponentially growing limit (WithBackoff). The call's context bounds
// everything: when it ends during a wait, the call fails with the context's
// code (CodeDeadlineExceeded or CodeCanceled). Every other error, and the
// last attempt's, is returned as it is.
func NewClientInterceptor(opts ...ClientOption) *ClientInterceptor {
	c := clientConfig{attempts: defaultAttempts, backoff: backoff{base: defaultBackoff, limit: defaultBackoffCap}}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	c.backoff.limit = max(c.backoff.limit, c.backoff.base)
	return &ClientInterceptor{clientConfig: c}
}

// WrapStreamingClient returns next: streams get no key and no retries.
func (c *ClientInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler returns next.
func (c *ClientInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// WrapUnary sends the key and retries a unary call; on a handler it returns
// next.
func (c *ClientInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if !req.Spec().IsClient {
			return next(ctx, req)
		}
		h := req.Header()
		if len(h.Values(KeyHeader)) == 0 {
			key, ok := idemclient.KeyFrom(ctx)
			if !ok {
				key = idemclient.NewKey()
			} else if err := validKey(key); err != nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("idemconnect: the key set by idemclient.WithKey cannot be sent: %w", err))
			}
			h.Set(KeyHeader, key)
		}
		sent := h.Clone() // a transport may add headers to the request's own
		for attempt := 1; ; attempt++ {
			if attempt > 1 {
				clear(h)
				maps.Copy(h, sent.Clone())
			}
			resp, err := next(ctx, req)
			if err == nil || attempt >= c.attempts || ctx.Err() != nil {
				return resp, err
			}
			wait, retry := c.retryWait(err, attempt)
			if !retry {
				return resp, err
			}
			if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= wait {
				return resp, err // the deadline would end the wait: the server's answer says more
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, ctxError(ctx)
			case <-t.C:
			}
		}
	}
}

// ctxError returns the ended context's error as a Connect error.
func ctxError(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
	}
	return connect.NewError(connect.CodeCanceled, ctx.Err())
}

// retryWait returns how long to wait before retrying after err, and whether
// to retry at all.
func (c *clientConfig) retryWait(err error, attempt int) (time.Duration, bool) {
	var ce *connect.Error
	if !errors.As(err, &ce) || ce == nil {
		return 0, false
	}
	var info *errdetails.RetryInfo
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if ri, ok := v.(*errdetails.RetryInfo); ok {
				info = ri
				break
			}
		}
	}
	switch code := ce.Code(); {
	case info != nil && (code == connect.CodeUnavailable || code == connect.CodeAborted):
		d := info.GetRetryDelay().AsDuration()
		return max(d, 0), d <= maxRetryDelay
	case code == connect.CodeUnavailable:
		return c.backoff.jittered(attempt, mrand.Int64N), true
	}
	return 0, false
}
