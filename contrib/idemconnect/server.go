package idemconnect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"connectrpc.com/connect"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemkit/idem"
)

// KeyHeader is the request header that carries the idempotency key: the
// header of idem's HTTP middleware, and the idempotency-key metadata of
// idemgrpc when a call uses the gRPC protocol.
const KeyHeader = "Idempotency-Key"

// ReplayedHeader is the response header that marks a replayed answer; its
// value is "true".
const ReplayedHeader = "Idempotent-Replayed"

const defaultRetryDelay = time.Second

// ServerOption configures NewServerInterceptor.
type ServerOption func(*serverConfig)

type serverConfig struct {
	scope    func(ctx context.Context) string
	required map[string]bool
	keyFunc  func(ctx context.Context, req any) (string, bool)
	retry    time.Duration
	errs     []string
}

func (c *serverConfig) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
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
	return func(c *serverConfig) {
		if f == nil {
			c.fail("WithScope(nil)")
		}
		c.scope = f
	}
}

// WithRequiredKey names the procedures ("/pkg.Service/Method") that must
// carry a key: a call to one of them without a key gets
// CodeInvalidArgument (ReasonKeyMissing) and the handler does not run.
// Calls to other procedures without a key pass through untouched. Calls to
// several options add up. No procedure, or a name that is not a procedure,
// makes NewServerInterceptor panic.
func WithRequiredKey(procedures ...string) ServerOption {
	return func(c *serverConfig) {
		if len(procedures) == 0 {
			c.fail("WithRequiredKey with no procedure")
		}
		for _, m := range procedures {
			if i := strings.LastIndexByte(m, '/'); i <= 1 || m[0] != '/' || i == len(m)-1 {
				c.fail("WithRequiredKey: %q is not a procedure (/pkg.Service/Method)", m)
				continue
			}
			if c.required == nil {
				c.required = make(map[string]bool)
			}
			c.required[m] = true
		}
	}
}

// WithKeyFunc sets a function that finds the key in the call, e.g. in an
// AIP-155 request_id field of the request message, which it gets as req.
// When it reports true, its key is the call's key (used as it is, and
// validated like any key); when it reports false, the key is read from the
// KeyHeader header as usual.
func WithKeyFunc(f func(ctx context.Context, req any) (string, bool)) ServerOption {
	return func(c *serverConfig) {
		if f == nil {
			c.fail("WithKeyFunc(nil)")
		}
		c.keyFunc = f
	}
}

// WithRetryDelay sets the delay, sent in an errdetails.RetryInfo, after which
// a duplicate that arrived while the first call runs should retry, when the
// Guard has no WithWait or the wait ran out. It is capped by the time left on
// the first call's lease. The default is 1s; zero or negative means the
// default.
func WithRetryDelay(d time.Duration) ServerOption {
	return func(c *serverConfig) {
		if d > 0 {
			c.retry = d
		}
	}
}

// ServerInterceptor is a connect.Interceptor for handlers that runs each
// unary call carrying an idempotency key at most once; see
// NewServerInterceptor.
type ServerInterceptor struct {
	g *idem.Guard
	serverConfig
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
	if g == nil {
		panic("idemconnect: NewServerInterceptor with a nil Guard")
	}
	c := serverConfig{retry: defaultRetryDelay}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if len(c.errs) > 0 {
		panic("idemconnect: NewServerInterceptor: " + strings.Join(c.errs, "; "))
	}
	return &ServerInterceptor{g: g, serverConfig: c}
}

// WrapStreamingClient returns next: streams are not protected.
func (s *ServerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler returns next: streams are not protected.
func (s *ServerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// errRelease is what the function given to idem.Do returns for an answer
// that must not be stored: the key is released.
var errRelease = errors.New("idemconnect: answer not stored")

// WrapUnary protects a unary handler; on a client it returns next.
func (s *ServerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		procedure := req.Spec().Procedure
		key, found, err := s.keyOf(ctx, req)
		if err != nil {
			return nil, err
		}
		if !found {
			if s.required[procedure] {
				return nil, newError(connect.CodeInvalidArgument, "idem: this procedure needs an idempotency key: create a unique key (a UUID) when the operation is created, send it in the "+KeyHeader+" header and reuse it on every retry", errorInfo(ReasonKeyMissing))
			}
			return next(ctx, req)
		}
		var scope string
		if s.scope != nil {
			if scope = s.scope(ctx); scope == "" {
				slog.ErrorContext(ctx, "idemconnect: call refused: WithScope returned an empty scope; is authentication in front of the interceptor?", "procedure", procedure)
				return nil, newError(connect.CodeInternal, "idem: the server could not tell which account this call's idempotency key belongs to, so the call was not run", errorInfo(ReasonScopeMissing))
			}
		}
		msg, ok := req.Any().(proto.Message)
		if !ok {
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("idem: request of type %T is not a protocol buffer message", req.Any()))
		}
		fp, err := fingerprint(procedure, msg)
		if err != nil {
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("idem: %w", err))
		}

		var (
			ran  bool
			resp connect.AnyResponse
			herr error
		)
		payload, err := idem.Do(ctx, s.g, opKey(scope, procedure, key), fp, func(ctx context.Context, a *idem.Attempt) ([]byte, error) {
			ran = true
			resp, herr = next(withAttempt(ctx, a), req)
			return record(resp, herr)
		})
		switch {
		case ran:
			// Stored, released or not recorded (the Guard logged that):
			// the handler's own answer.
			return resp, herr
		case err != nil:
			return nil, s.refuse(ctx, procedure, err)
		}
		return replay(ctx, procedure, payload)
	}
}

// keyOf returns the call's key and whether it has one, or an
// InvalidArgument error for an invalid key.
func (s *ServerInterceptor) keyOf(ctx context.Context, req connect.AnyRequest) (key string, found bool, err error) {
	if s.keyFunc != nil {
		if k, ok := s.keyFunc(ctx, req.Any()); ok {
			if err := validKey(k); err != nil {
				return "", false, invalidKey(err)
			}
			return k, true, nil
		}
	}
	values := req.Header().Values(KeyHeader)
	switch len(values) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", false, invalidKey(fmt.Errorf("%w: %s sent %d times", idem.ErrInvalidKey, KeyHeader, len(values)))
	}
	if key, err = parseKey(values[0]); err != nil {
		return "", false, invalidKey(err)
	}
	return key, true, nil
}

func invalidKey(err error) error {
	return newError(connect.CodeInvalidArgument, err.Error()+"; send 1 to 255 printable ASCII characters, a UUID is recommended", errorInfo(ReasonKeyInvalid))
}

// record returns the payload that stores the handler's answer, or
// errRelease when the answer must not be stored.
func record(resp connect.AnyResponse, err error) ([]byte, error) {
	if err != nil {
		st := statusOf(err)
		if storedCode(uint32(st.GetCode())) || errors.Is(err, idem.ErrPermanent) {
			return encodeStatus(st)
		}
		return nil, errRelease
	}
	if resp == nil {
		return nil, errRelease
	}
	m, ok := resp.Any().(proto.Message)
	if !ok {
		return nil, errRelease
	}
	return encodeMessage(m)
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

// refuse returns the error for a call whose handler did not run.
func (s *ServerInterceptor) refuse(ctx context.Context, procedure string, err error) error {
	switch {
	case errors.Is(err, idem.ErrMismatch):
		return newError(connect.CodeInvalidArgument, "idem: this idempotency key was already used with a different request; use a new key for a new operation, reuse a key only to retry exactly the same call", errorInfo(ReasonKeyReused))
	case errors.Is(err, idem.ErrInProgress):
		d := s.retry
		if e, ok := errors.AsType[*idem.InProgressError](err); ok {
			d = max(min(d, e.RetryAfter), time.Millisecond)
		}
		return newError(connect.CodeAborted, "idem: a call with this idempotency key is still running; retry after the RetryInfo delay with the same key to get its answer", errorInfo(ReasonInProgress), retryInfo(d))
	case ctx.Err() != nil:
		return statusError(statusOf(context.Cause(ctx)))
	case errors.Is(err, idem.ErrInvalidKey):
		return invalidKey(err)
	case errors.Is(err, idem.ErrStoreUnavailable):
		return newError(connect.CodeUnavailable, "idem: the idempotency store is unreachable, so the call was not run; retry with the same key", errorInfo(ReasonStoreUnavailable))
	}
	slog.ErrorContext(ctx, "idemconnect: call refused", "procedure", procedure, "err", err)
	return connect.NewError(connect.CodeInternal, err)
}

// replayedMessage is a stored response on its way out: a proto.Message
// that encodes as the stored message (Connect's codecs encode through
// ProtoReflect).
type replayedMessage struct{ proto.Message }

// replay returns a stored answer, marked with ReplayedHeader.
func replay(ctx context.Context, procedure string, payload []byte) (connect.AnyResponse, error) {
	m, st, err := decodePayload(payload)
	if err != nil {
		slog.ErrorContext(ctx, "idemconnect: stored answer does not decode", "procedure", procedure, "err", err)
		return nil, newError(connect.CodeInternal, "idem: this call was already run, but its stored answer cannot be read; do not retry it, look up the outcome of the operation instead", errorInfo(ReasonStoredUnreadable))
	}
	if st != nil {
		e := statusError(st)
		e.Meta().Set(ReplayedHeader, "true")
		return nil, e
	}
	resp := connect.NewResponse(&replayedMessage{m})
	resp.Header().Set(ReplayedHeader, "true")
	return resp, nil
}

// statusError returns the Connect error for a status.
func statusError(st *spb.Status) *connect.Error {
	e := connect.NewError(connect.Code(st.GetCode()), errors.New(st.GetMessage()))
	for _, a := range st.GetDetails() {
		if d, err := connect.NewErrorDetail(a); err == nil {
			e.AddDetail(d)
		}
	}
	return e
}

// newError returns one of idem's own errors, with details.
func newError(code connect.Code, msg string, details ...proto.Message) *connect.Error {
	e := connect.NewError(code, errors.New(msg))
	for _, m := range details {
		if d, err := connect.NewErrorDetail(m); err == nil {
			e.AddDetail(d)
		}
	}
	return e
}
