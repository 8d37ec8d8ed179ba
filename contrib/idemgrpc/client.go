package idemgrpc

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem/contrib/internal/rpcidem"
)

// ClientOption configures UnaryClientInterceptor.
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
	c := rpcidem.NewClient(opts)
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		if len(metadata.ValueFromOutgoingContext(ctx, MetadataKey)) == 0 {
			key, err := rpcidem.SendKey(ctx)
			if err != nil {
				return &keyError{err: err}
			}
			ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, key)
		}
		err, ended := c.Retry(ctx, func(int) error {
			return invoker(ctx, method, req, reply, cc, callOpts...)
		}, failure)
		if ended {
			return status.FromContextError(err).Err()
		}
		return err
	}
}

// failure reads a failed call's status code and RetryInfo.
func failure(err error) (rpcidem.Failure, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return rpcidem.Failure{}, false
	}
	f := rpcidem.Failure{Code: uint32(st.Code())}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			f.RetryDelay, f.HasRetryInfo = ri.GetRetryDelay().AsDuration(), true
			break
		}
	}
	return f, true
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
