package idemgrpc

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

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

// ClientOption configures UnaryClientInterceptor.
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

// UnaryClientInterceptor returns an interceptor that makes unary calls safe
// to retry and retries them.
//
// Each call carries an idempotency key in its MetadataKey metadata: the
// call's own, when its outgoing metadata already has one (sent as it is);
// else the key set by idemclient.WithKey on the call's context; else a new key made
// by idemclient.NewKey for this call. A key from the context that is not 1 to 255
// bytes of printable ASCII fails the call with InvalidArgument, at once; the
// error also matches idem.ErrInvalidKey under errors.Is.
//
// Then it retries the call, always with the same key, up to WithMaxAttempts
// (default 5) attempts, when the call fails with Unavailable, or with Aborted
// carrying an errdetails.RetryInfo (a server under idem answers so while the
// first call with the key still runs). It waits for the RetryInfo delay when
// the error carries one, returning the error at once when that is longer than
// 30s or than the time left before the call's deadline; otherwise it waits a
// random time up to an exponentially growing limit (WithBackoff). The call's
// context bounds everything: when it ends during a wait, the call fails with
// the context's status (DeadlineExceeded or Canceled). Every other error, and
// the last attempt's, is returned as it is.
//
// Retries below this interceptor, by gRPC's own retry policy (the service
// config's retryPolicy), send the same metadata and so the same key.
// Retries above it (a loop around the call) are new calls with new keys,
// unless the caller sets one with idemclient.WithKey for the whole loop.
func UnaryClientInterceptor(opts ...ClientOption) grpc.UnaryClientInterceptor {
	c := clientConfig{attempts: defaultAttempts, backoff: backoff{base: defaultBackoff, limit: defaultBackoffCap}}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	c.backoff.limit = max(c.backoff.limit, c.backoff.base)
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		if len(metadata.ValueFromOutgoingContext(ctx, MetadataKey)) == 0 {
			key, ok := idemclient.KeyFrom(ctx)
			if !ok {
				key = idemclient.NewKey()
			} else if err := validKey(key); err != nil {
				return &keyError{err: err}
			}
			ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, key)
		}
		for attempt := 1; ; attempt++ {
			err := invoker(ctx, method, req, reply, cc, callOpts...)
			if err == nil || attempt >= c.attempts || ctx.Err() != nil {
				return err
			}
			wait, retry := c.retryWait(err, attempt)
			if !retry {
				return err
			}
			if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= wait {
				return err // the deadline would end the wait: the server's answer says more
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return status.FromContextError(ctx.Err()).Err()
			case <-t.C:
			}
		}
	}
}

// retryWait returns how long to wait before retrying after err, and whether
// to retry at all.
func (c *clientConfig) retryWait(err error, attempt int) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	var info *errdetails.RetryInfo
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			info = ri
			break
		}
	}
	switch {
	case info != nil && (st.Code() == codes.Unavailable || st.Code() == codes.Aborted):
		d := info.GetRetryDelay().AsDuration()
		return max(d, 0), d <= maxRetryDelay
	case st.Code() == codes.Unavailable:
		return c.backoff.jittered(attempt, mrand.Int64N), true
	}
	return 0, false
}

// keyError is the client's error for an invalid key from idemclient.WithKey: an
// InvalidArgument status that also matches idem.ErrInvalidKey.
type keyError struct{ err error }

func (e *keyError) Error() string { return e.err.Error() }
func (e *keyError) Unwrap() error { return e.err }

// GRPCStatus returns the error's status, InvalidArgument, for status.FromError.
func (e *keyError) GRPCStatus() *status.Status {
	return status.New(codes.InvalidArgument, fmt.Sprintf("idemgrpc: the key set by idemclient.WithKey cannot be sent: %v", e.err))
}
