package idemconnect

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/idemkit/idem/contrib/internal/rpcidem"
)

// ClientOption configures NewClientInterceptor.
type ClientOption func(*clientConfig)

type clientConfig = rpcidem.ClientConfig

// WithMaxAttempts sets how many times one call is sent at most, the first
// time included. The default is 5; values below 1 mean 1 (no retry).
func WithMaxAttempts(n int) ClientOption {
	return func(c *clientConfig) { c.SetMaxAttempts(n) }
}

// WithBackoff sets the exponential backoff between attempts when the error
// carries no errdetails.RetryInfo: before retry n the client sleeps a random
// duration between 0 and min(limit, base·2ⁿ⁻¹) ("full jitter"). The defaults
// are 200ms and 10s; a base of zero or less keeps the default base, and a
// limit below the base is raised to it.
func WithBackoff(base, limit time.Duration) ClientOption {
	return func(c *clientConfig) { c.SetBackoff(base, limit) }
}

// ClientInterceptor is a connect.Interceptor for clients that sends an
// idempotency key with each unary call and retries with it; see
// NewClientInterceptor.
type ClientInterceptor struct {
	c *rpcidem.Client
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
	return &ClientInterceptor{rpcidem.NewClient(opts)}
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
			key, err := rpcidem.SendKey(ctx)
			if err != nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("idemconnect: the key set by idemclient.WithKey cannot be sent: %w", err))
			}
			h.Set(KeyHeader, key)
		}
		sent := h.Clone() // a transport may add headers to the request's own
		var resp connect.AnyResponse
		err, ended := c.c.Retry(ctx, func(attempt int) error {
			if attempt > 1 {
				clear(h)
				maps.Copy(h, sent.Clone())
			}
			var err error
			resp, err = next(ctx, req)
			return err
		}, failure)
		if ended {
			return nil, ctxError(err)
		}
		return resp, err
	}
}

// ctxError returns an ended context's error as a Connect error.
func ctxError(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	return connect.NewError(connect.CodeCanceled, err)
}

// failure reads a failed call's code and RetryInfo.
func failure(err error) (rpcidem.Failure, bool) {
	var ce *connect.Error
	if !errors.As(err, &ce) || ce == nil {
		return rpcidem.Failure{}, false
	}
	f := rpcidem.Failure{Code: uint32(ce.Code())}
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if ri, ok := v.(*errdetails.RetryInfo); ok {
				f.RetryDelay, f.HasRetryInfo = ri.GetRetryDelay().AsDuration(), true
				break
			}
		}
	}
	return f, true
}
