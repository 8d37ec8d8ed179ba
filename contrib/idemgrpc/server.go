package idemgrpc

import (
	"context"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/internal/rpcidem"
)

// MetadataKey is the request metadata that carries the idempotency key.
const MetadataKey = "idempotency-key"

// ReplayedKey is the response header metadata that marks a replayed answer;
// its value is "true".
const ReplayedKey = "idempotent-replayed"

// ErrorDomain is the domain of the errdetails.ErrorInfo that idem's own
// errors carry.
const ErrorDomain = rpcidem.ErrorDomain

// Reasons of the errdetails.ErrorInfo that idem's own errors carry; a client
// may branch on them.
const (
	// ReasonKeyMissing: a method named in WithRequiredKey was called without
	// a key (InvalidArgument).
	ReasonKeyMissing = rpcidem.ReasonKeyMissing
	// ReasonKeyInvalid: the key is empty, longer than 255 bytes, not
	// printable ASCII, or sent twice (InvalidArgument).
	ReasonKeyInvalid = rpcidem.ReasonKeyInvalid
	// ReasonKeyReused: the key was first used with another request
	// (InvalidArgument). Do not retry: a new operation needs a new key.
	ReasonKeyReused = rpcidem.ReasonKeyReused
	// ReasonInProgress: the first call with this key still runs (Aborted,
	// with an errdetails.RetryInfo). Retry with the same key.
	ReasonInProgress = rpcidem.ReasonInProgress
	// ReasonStoreUnavailable: the idempotency store is unreachable, so the
	// call was not run (Unavailable). Retry with the same key.
	ReasonStoreUnavailable = rpcidem.ReasonStoreUnavailable
	// ReasonScopeMissing: the server's WithScope returned "" (Internal).
	ReasonScopeMissing = rpcidem.ReasonScopeMissing
	// ReasonStoredUnreadable: the call was already run but its stored answer
	// cannot be read (Internal). Do not retry; look up the outcome.
	ReasonStoredUnreadable = rpcidem.ReasonStoredUnreadable
)

// ServerOption configures UnaryServerInterceptor.
type ServerOption func(*serverConfig)

type serverConfig = rpcidem.ServerConfig

var protocol = &rpcidem.Protocol{
	Package:     "idemgrpc",
	Constructor: "UnaryServerInterceptor",
	Method:      "method",
	FullMethod:  "full method",
	KeyName:     MetadataKey,
	KeyPlace:    "metadata",
}

// WithScope sets the function that returns the scope of a call's key: the
// tenant, account or principal that owns it, typically read from what an
// authentication interceptor placed before this one put on the context.
// Records are keyed by scope, full method and key, so equal keys sent by two
// scopes never meet. The default is one scope for everyone, right only when
// one client owns the whole service. A function that returns "" fails
// closed: the call gets Internal (ReasonScopeMissing), the handler does not
// run and the store is not asked. It runs only for calls that carry a key.
func WithScope(f func(ctx context.Context) string) ServerOption {
	return func(c *serverConfig) { c.SetScope(f) }
}

// WithRequiredKey names the full methods ("/pkg.Service/Method") that must
// carry a key: a call to one of them without a key gets InvalidArgument
// (ReasonKeyMissing) and the handler does not run. Calls to other methods
// without a key pass through untouched. Calls to several options add up.
// No method, or a name that is not a full method, makes
// UnaryServerInterceptor panic.
func WithRequiredKey(fullMethods ...string) ServerOption {
	return func(c *serverConfig) { c.Require(protocol, fullMethods) }
}

// WithKeyFunc sets a function that finds the key in the call, e.g. in an
// AIP-155 request_id field of the request message. When it reports true, its
// key is the call's key (used as it is, and validated like any key); when it
// reports false, the key is read from the metadata (MetadataKey) as usual.
func WithKeyFunc(f func(ctx context.Context, req any) (string, bool)) ServerOption {
	return func(c *serverConfig) { c.SetKeyFunc(f) }
}

// WithRetryDelay sets the delay, sent in an errdetails.RetryInfo, after which
// a duplicate that arrived while the first call runs should retry, when the
// Guard has no WithWait or the wait ran out. It is capped by the time left on
// the first call's lease. The default is 1s; zero or negative means the
// default.
func WithRetryDelay(d time.Duration) ServerOption {
	return func(c *serverConfig) { c.SetRetryDelay(d) }
}

type server struct {
	*rpcidem.Server[proto.Message, *spb.Status]
}

// UnaryServerInterceptor returns an interceptor that runs each unary call
// carrying an idempotency key at most once per scope, full method and key,
// across every replica sharing g's store, and answers its repeats with the
// stored answer. The package documentation has the contract. Of the Guard's
// options, WithLease, WithRetention, WithWait, WithWriteTimeout and
// WithLogger apply. Streaming calls do not go through unary interceptors:
// they are not protected.
//
// UnaryServerInterceptor panics on a nil Guard or invalid options, at
// construction.
func UnaryServerInterceptor(g *idem.Guard, opts ...ServerOption) grpc.UnaryServerInterceptor {
	s := server{rpcidem.NewServer(protocol, codec, g, opts)}
	return s.intercept
}

func (s server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	var (
		resp any
		herr error
	)
	o := s.Run(ctx, info.FullMethod, req, metadata.ValueFromIncomingContext(ctx, MetadataKey), func(ctx context.Context) ([]byte, error) {
		resp, herr = handler(ctx, req)
		return record(resp, herr)
	})
	switch {
	case o.Pass:
		return handler(ctx, req)
	case o.Ran:
		return resp, herr
	case o.Refused != nil:
		return nil, refusal(o.Refused)
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs(ReplayedKey, "true"))
	if o.IsStatus {
		return nil, status.FromProto(o.Status).Err()
	}
	return o.Message, nil
}

// record returns the payload that stores the handler's answer, or
// rpcidem.ErrRelease when the answer must not be stored.
func record(resp any, err error) ([]byte, error) {
	if err != nil {
		st, ok := status.FromError(err)
		if !ok {
			st = status.FromContextError(err)
		}
		return codec.RecordError(err, uint32(st.Code()), st.Proto())
	}
	m, ok := resp.(proto.Message) // nil, or not a message: gRPC fails it anyway
	return codec.RecordMessage(m, ok)
}

// refusal returns the status error for a call whose handler did not run.
func refusal(r *rpcidem.Refusal) error {
	if r.Cause != nil {
		return status.FromContextError(r.Cause).Err()
	}
	st := status.New(codes.Code(r.Code), r.Message)
	var details []protoadapt.MessageV1
	if r.Reason != "" {
		details = append(details, &errdetails.ErrorInfo{Reason: r.Reason, Domain: ErrorDomain})
	}
	if r.RetryDelay > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(r.RetryDelay)})
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st.Err()
}
