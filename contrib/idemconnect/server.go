package idemconnect

import (
	"context"
	"errors"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/internal/rpcidem"
)

// KeyHeader is the request header that carries the idempotency key: the
// header of idem's HTTP middleware, and the idempotency-key metadata of
// idemgrpc when a call uses the gRPC protocol.
const KeyHeader = "Idempotency-Key"

// ReplayedHeader is the response header that marks a replayed answer; its
// value is "true".
const ReplayedHeader = "Idempotent-Replayed"

// ErrorDomain is the domain of the errdetails.ErrorInfo that idem's own
// errors carry.
const ErrorDomain = rpcidem.ErrorDomain

// Reasons of the errdetails.ErrorInfo that idem's own errors carry; a client
// may branch on them.
const (
	// ReasonKeyMissing: a procedure named in WithRequiredKey was called
	// without a key (CodeInvalidArgument).
	ReasonKeyMissing = rpcidem.ReasonKeyMissing
	// ReasonKeyInvalid: the key is empty, longer than 255 bytes, not
	// printable ASCII, or sent twice (CodeInvalidArgument).
	ReasonKeyInvalid = rpcidem.ReasonKeyInvalid
	// ReasonKeyReused: the key was first used with another request
	// (CodeInvalidArgument). Do not retry: a new operation needs a new key.
	ReasonKeyReused = rpcidem.ReasonKeyReused
	// ReasonInProgress: the first call with this key still runs
	// (CodeAborted, with an errdetails.RetryInfo). Retry with the same key.
	ReasonInProgress = rpcidem.ReasonInProgress
	// ReasonStoreUnavailable: the idempotency store is unreachable, so the
	// call was not run (CodeUnavailable). Retry with the same key.
	ReasonStoreUnavailable = rpcidem.ReasonStoreUnavailable
	// ReasonScopeMissing: the server's WithScope returned "" (CodeInternal).
	ReasonScopeMissing = rpcidem.ReasonScopeMissing
	// ReasonStoredUnreadable: the call was already run but its stored answer
	// cannot be read (CodeInternal). Do not retry; look up the outcome.
	ReasonStoredUnreadable = rpcidem.ReasonStoredUnreadable
)

// ServerOption configures NewServerInterceptor.
type ServerOption func(*serverConfig)

type serverConfig = rpcidem.ServerConfig

var protocol = &rpcidem.Protocol{
	Package:     "idemconnect",
	Constructor: "NewServerInterceptor",
	Method:      "procedure",
	FullMethod:  "procedure",
	KeyName:     KeyHeader,
	KeyPlace:    "header",
}

// WithScope sets the function that returns the scope of a call's key: the
// tenant, account or principal that owns it, typically read from what an
// authentication interceptor placed before this one put on the context
// (connect.CallInfoForHandlerContext gives the request headers). Records are
// keyed by scope, procedure and key, so equal keys sent by two scopes never
// meet. The default is one scope for everyone, right only when one client
// owns the whole service. A function that returns "" fails closed: the call
// gets CodeInternal (ReasonScopeMissing), the handler does not run and the
// store is not asked. It runs only for calls that carry a key.
func WithScope(f func(ctx context.Context) string) ServerOption {
	return func(c *serverConfig) { c.SetScope(f) }
}

// WithRequiredKey names the procedures ("/pkg.Service/Method") that must
// carry a key: a call to one of them without a key gets
// CodeInvalidArgument (ReasonKeyMissing) and the handler does not run.
// Calls to other procedures without a key pass through untouched. Calls to
// several options add up. No procedure, or a name that is not a procedure,
// makes NewServerInterceptor panic.
func WithRequiredKey(procedures ...string) ServerOption {
	return func(c *serverConfig) { c.Require(protocol, procedures) }
}

// WithKeyFunc sets a function that finds the key in the call, e.g. in an
// AIP-155 request_id field of the request message, which it gets as req.
// When it reports true, its key is the call's key (used as it is, and
// validated like any key); when it reports false, the key is read from the
// KeyHeader header as usual.
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

// ServerInterceptor is a connect.Interceptor for handlers that runs each
// unary call carrying an idempotency key at most once; see
// NewServerInterceptor.
type ServerInterceptor struct {
	s *rpcidem.Server[proto.Message, *spb.Status]
}

var _ connect.Interceptor = (*ServerInterceptor)(nil)

// NewServerInterceptor returns an interceptor that runs each unary call
// carrying an idempotency key at most once per scope, procedure and key,
// across every replica sharing g's store, and answers its repeats with the
// stored answer. Pass it to handlers with connect.WithInterceptors. The
// package documentation has the contract. Of the Guard's options,
// WithLease, WithRetention, WithWait, WithWriteTimeout and WithLogger apply.
//
// NewServerInterceptor panics on a nil Guard or invalid options, at
// construction.
func NewServerInterceptor(g *idem.Guard, opts ...ServerOption) *ServerInterceptor {
	return &ServerInterceptor{rpcidem.NewServer(protocol, codec, g, opts)}
}

// WrapStreamingClient returns next: streams are not protected.
func (s *ServerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler returns next: streams are not protected.
func (s *ServerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// WrapUnary protects a unary handler; on a client it returns next.
func (s *ServerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		var (
			resp connect.AnyResponse
			herr error
		)
		o := s.s.Run(ctx, req.Spec().Procedure, req.Any(), req.Header().Values(KeyHeader), func(ctx context.Context) ([]byte, error) {
			resp, herr = next(ctx, req)
			return record(resp, herr)
		})
		switch {
		case o.Pass:
			return next(ctx, req)
		case o.Ran:
			return resp, herr
		case o.Refused != nil:
			return nil, refusal(o.Refused)
		}
		if o.IsStatus {
			e := statusError(o.Status)
			e.Meta().Set(ReplayedHeader, "true")
			return nil, e
		}
		r := connect.NewResponse(&replayedMessage{o.Message})
		r.Header().Set(ReplayedHeader, "true")
		return r, nil
	}
}

// record returns the payload that stores the handler's answer, or
// rpcidem.ErrRelease when the answer must not be stored.
func record(resp connect.AnyResponse, err error) ([]byte, error) {
	if err != nil {
		st := statusOf(err)
		return codec.RecordError(err, uint32(st.GetCode()), st)
	}
	if resp == nil {
		return codec.RecordMessage(nil, false)
	}
	m, ok := resp.Any().(proto.Message)
	return codec.RecordMessage(m, ok)
}

// statusOf returns the code, message and details Connect sends for a
// handler's error.
func statusOf(err error) *spb.Status {
	var ce *connect.Error
	if !errors.As(err, &ce) || ce == nil {
		code := connect.CodeUnknown
		switch {
		case errors.Is(err, context.Canceled):
			code = connect.CodeCanceled
		case errors.Is(err, context.DeadlineExceeded):
			code = connect.CodeDeadlineExceeded
		}
		return &spb.Status{Code: int32(code), Message: err.Error()}
	}
	st := &spb.Status{Code: int32(ce.Code()), Message: ce.Message()}
	for _, d := range ce.Details() {
		st.Details = append(st.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
	}
	return st
}

// refusal returns the error for a call whose handler did not run.
func refusal(r *rpcidem.Refusal) error {
	if r.Cause != nil {
		return statusError(statusOf(r.Cause))
	}
	e := connect.NewError(connect.Code(r.Code), errors.New(r.Message))
	if r.Reason != "" {
		addDetail(e, &errdetails.ErrorInfo{Reason: r.Reason, Domain: ErrorDomain})
	}
	if r.RetryDelay > 0 {
		addDetail(e, &errdetails.RetryInfo{RetryDelay: durationpb.New(r.RetryDelay)})
	}
	return e
}

// addDetail adds a detail to e; idem's details always encode.
func addDetail(e *connect.Error, m proto.Message) {
	if d, err := connect.NewErrorDetail(m); err == nil {
		e.AddDetail(d)
	}
}

// replayedMessage is a stored response on its way out: a proto.Message
// that encodes as the stored message (Connect's codecs encode through
// ProtoReflect).
type replayedMessage struct{ proto.Message }

// statusError returns the Connect error for a status.
func statusError(st *spb.Status) *connect.Error {
	e := connect.NewError(connect.Code(st.GetCode()), errors.New(st.GetMessage()))
	for _, a := range st.GetDetails() {
		addDetail(e, a)
	}
	return e
}
