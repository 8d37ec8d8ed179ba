package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemkit/idem"
)

// MetadataKey is the request metadata that carries the idempotency key.
const MetadataKey = "idempotency-key"

// ReplayedKey is the response header metadata that marks a replayed answer;
// its value is "true".
const ReplayedKey = "idempotent-replayed"

const defaultRetryDelay = time.Second

// ServerOption configures UnaryServerInterceptor.
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
// authentication interceptor placed before this one put on the context.
// Records are keyed by scope, full method and key, so equal keys sent by two
// scopes never meet. The default is one scope for everyone, right only when
// one client owns the whole service. A function that returns "" fails
// closed: the call gets Internal (ReasonScopeMissing), the handler does not
// run and the store is not asked. It runs only for calls that carry a key.
func WithScope(f func(ctx context.Context) string) ServerOption {
	return func(c *serverConfig) {
		if f == nil {
			c.fail("WithScope(nil)")
		}
		c.scope = f
	}
}

// WithRequiredKey names the full methods ("/pkg.Service/Method") that must
// carry a key: a call to one of them without a key gets InvalidArgument
// (ReasonKeyMissing) and the handler does not run. Calls to other methods
// without a key pass through untouched. Calls to several options add up.
// No method, or a name that is not a full method, makes
// UnaryServerInterceptor panic.
func WithRequiredKey(fullMethods ...string) ServerOption {
	return func(c *serverConfig) {
		if len(fullMethods) == 0 {
			c.fail("WithRequiredKey with no method")
		}
		for _, m := range fullMethods {
			if i := strings.LastIndexByte(m, '/'); i <= 1 || m[0] != '/' || i == len(m)-1 {
				c.fail("WithRequiredKey: %q is not a full method (/pkg.Service/Method)", m)
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
// AIP-155 request_id field of the request message. When it reports true, its
// key is the call's key (used as it is, and validated like any key); when it
// reports false, the key is read from the metadata (MetadataKey) as usual.
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

type server struct {
	g *idem.Guard
	serverConfig
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
	if g == nil {
		panic("idemgrpc: UnaryServerInterceptor with a nil Guard")
	}
	c := serverConfig{retry: defaultRetryDelay}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if len(c.errs) > 0 {
		panic("idemgrpc: UnaryServerInterceptor: " + strings.Join(c.errs, "; "))
	}
	s := &server{g: g, serverConfig: c}
	return s.intercept
}

// errRelease is what the function given to idem.Do returns for an answer
// that must not be stored: the key is released.
var errRelease = errors.New("idemgrpc: answer not stored")

func (s *server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	key, found, err := s.keyOf(ctx, req)
	if err != nil {
		return nil, err
	}
	if !found {
		if s.required[info.FullMethod] {
			return nil, statusError(codes.InvalidArgument, "idem: this method needs an idempotency key: create a unique key (a UUID) when the operation is created, send it in the "+MetadataKey+" metadata and reuse it on every retry", errorInfo(ReasonKeyMissing))
		}
		return handler(ctx, req)
	}
	var scope string
	if s.scope != nil {
		if scope = s.scope(ctx); scope == "" {
			slog.ErrorContext(ctx, "idemgrpc: call refused: WithScope returned an empty scope; is authentication in front of the interceptor?", "method", info.FullMethod)
			return nil, statusError(codes.Internal, "idem: the server could not tell which account this call's idempotency key belongs to, so the call was not run", errorInfo(ReasonScopeMissing))
		}
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "idem: request of type %T is not a protocol buffer message", req)
	}
	fp, err := fingerprint(info.FullMethod, msg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "idem: %v", err)
	}

	var (
		ran  bool
		resp any
		herr error
	)
	payload, err := idem.Do(ctx, s.g, opKey(scope, info.FullMethod, key), fp, func(ctx context.Context, a *idem.Attempt) ([]byte, error) {
		ran = true
		resp, herr = handler(withAttempt(ctx, a), req)
		return record(resp, herr)
	})
	switch {
	case ran:
		// Stored, released or not recorded (the Guard logged that): the
		// handler's own answer.
		return resp, herr
	case err != nil:
		return nil, s.refuse(ctx, info.FullMethod, err)
	}
	return replay(ctx, info.FullMethod, payload)
}

// keyOf returns the call's key and whether it has one, or an
// InvalidArgument error for an invalid key.
func (s *server) keyOf(ctx context.Context, req any) (key string, found bool, err error) {
	if s.keyFunc != nil {
		if k, ok := s.keyFunc(ctx, req); ok {
			if err := validKey(k); err != nil {
				return "", false, invalidKey(err)
			}
			return k, true, nil
		}
	}
	values := metadata.ValueFromIncomingContext(ctx, MetadataKey)
	switch len(values) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", false, invalidKey(fmt.Errorf("%w: %s sent %d times", idem.ErrInvalidKey, MetadataKey, len(values)))
	}
	if key, err = parseKey(values[0]); err != nil {
		return "", false, invalidKey(err)
	}
	return key, true, nil
}

func invalidKey(err error) error {
	return statusError(codes.InvalidArgument, err.Error()+"; send 1 to 255 printable ASCII characters, a UUID is recommended", errorInfo(ReasonKeyInvalid))
}

// record returns the payload that stores the handler's answer, or
// errRelease when the answer must not be stored.
func record(resp any, err error) ([]byte, error) {
	if err != nil {
		st := statusOf(err)
		if storedCode(uint32(st.Code())) || errors.Is(err, idem.ErrPermanent) {
			return encodeStatus(st.Proto())
		}
		return nil, errRelease
	}
	m, ok := resp.(proto.Message)
	if !ok {
		return nil, errRelease // nil, or not a message: gRPC fails it anyway
	}
	return encodeMessage(m)
}

// statusOf returns the status gRPC sends for a handler's error.
func statusOf(err error) *status.Status {
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	return st
}

// refuse returns the error for a call whose handler did not run.
func (s *server) refuse(ctx context.Context, method string, err error) error {
	switch {
	case errors.Is(err, idem.ErrMismatch):
		return statusError(codes.InvalidArgument, "idem: this idempotency key was already used with a different request; use a new key for a new operation, reuse a key only to retry exactly the same call", errorInfo(ReasonKeyReused))
	case errors.Is(err, idem.ErrInProgress):
		d := s.retry
		if e, ok := errors.AsType[*idem.InProgressError](err); ok {
			d = max(min(d, e.RetryAfter), time.Millisecond)
		}
		return statusError(codes.Aborted, "idem: a call with this idempotency key is still running; retry after the RetryInfo delay with the same key to get its answer", errorInfo(ReasonInProgress), retryInfo(d))
	case ctx.Err() != nil:
		return status.FromContextError(context.Cause(ctx)).Err()
	case errors.Is(err, idem.ErrInvalidKey):
		return invalidKey(err)
	case errors.Is(err, idem.ErrStoreUnavailable):
		return statusError(codes.Unavailable, "idem: the idempotency store is unreachable, so the call was not run; retry with the same key", errorInfo(ReasonStoreUnavailable))
	}
	slog.ErrorContext(ctx, "idemgrpc: call refused", "method", method, "err", err)
	return status.Errorf(codes.Internal, "idem: %v", err)
}

// replay returns a stored answer, marked with ReplayedKey.
func replay(ctx context.Context, method string, payload []byte) (any, error) {
	m, st, err := decodePayload(payload)
	if err != nil {
		slog.ErrorContext(ctx, "idemgrpc: stored answer does not decode", "method", method, "err", err)
		return nil, statusError(codes.Internal, "idem: this call was already run, but its stored answer cannot be read; do not retry it, look up the outcome of the operation instead", errorInfo(ReasonStoredUnreadable))
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs(ReplayedKey, "true"))
	if st != nil {
		return nil, status.FromProto(st).Err()
	}
	return m, nil
}

// statusError returns a status error with details.
func statusError(code codes.Code, msg string, details ...proto.Message) error {
	p := &spb.Status{Code: int32(code), Message: msg}
	for _, d := range details {
		if a, err := anypb.New(d); err == nil {
			p.Details = append(p.Details, a)
		}
	}
	return status.FromProto(p).Err()
}
