package rpcidem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/wire"
)

// DefaultRetryDelay is the default of the modules' WithRetryDelay.
const DefaultRetryDelay = time.Second

// Protocol names what a module's messages, logs and panics say.
type Protocol struct {
	Package     string // the module's package, "idemgrpc"
	Constructor string // the function that makes the server interceptor
	Method      string // what the protocol calls a method: "method", "procedure"
	FullMethod  string // what it calls a method's full name: "full method", "procedure"
	KeyName     string // the header (metadata) that carries the key
	KeyPlace    string // where the key is sent: "metadata", "header"
}

// ServerConfig holds the server options: the modules' ServerOption
// functions set it.
type ServerConfig struct {
	scope    func(ctx context.Context) string
	required map[string]bool
	keyFunc  func(ctx context.Context, req any) (string, bool)
	retry    time.Duration
	errs     []string
}

func (c *ServerConfig) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

// SetScope sets the function that returns the scope of a call's key.
func (c *ServerConfig) SetScope(f func(ctx context.Context) string) {
	if f == nil {
		c.fail("WithScope(nil)")
	}
	c.scope = f
}

// Require adds methods (full names, "/pkg.Service/Method") that must carry
// a key; p names them in the errors about malformed names.
func (c *ServerConfig) Require(p *Protocol, methods []string) {
	if len(methods) == 0 {
		c.fail("WithRequiredKey with no %s", p.Method)
	}
	for _, m := range methods {
		if i := strings.LastIndexByte(m, '/'); i <= 1 || m[0] != '/' || i == len(m)-1 {
			c.fail("WithRequiredKey: %q is not a %s (/pkg.Service/Method)", m, p.FullMethod)
			continue
		}
		if c.required == nil {
			c.required = make(map[string]bool)
		}
		c.required[m] = true
	}
}

// SetKeyFunc sets the function that finds the key in the call.
func (c *ServerConfig) SetKeyFunc(f func(ctx context.Context, req any) (string, bool)) {
	if f == nil {
		c.fail("WithKeyFunc(nil)")
	}
	c.keyFunc = f
}

// SetRetryDelay sets the RetryInfo delay of an in-progress answer; zero or
// negative keeps the default.
func (c *ServerConfig) SetRetryDelay(d time.Duration) {
	if d > 0 {
		c.retry = d
	}
}

// Server is the protocol-independent part of a server interceptor.
type Server[M, S any] struct {
	cfg   ServerConfig
	g     *idem.Guard
	codec *Codec[M, S]
	p     *Protocol
}

// NewServer returns the server part of an interceptor on g. It panics on a
// nil Guard or invalid options, with a message naming p's constructor.
func NewServer[M, S any, O ~func(*ServerConfig)](p *Protocol, codec *Codec[M, S], g *idem.Guard, opts []O) *Server[M, S] {
	if g == nil {
		panic(p.Package + ": " + p.Constructor + " with a nil Guard")
	}
	c := ServerConfig{retry: DefaultRetryDelay}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if len(c.errs) > 0 {
		panic(p.Package + ": " + p.Constructor + ": " + strings.Join(c.errs, "; "))
	}
	return &Server[M, S]{cfg: c, g: g, codec: codec, p: p}
}

// Refusal is the answer to a call whose handler did not run, for the module
// to turn into its protocol's error.
type Refusal struct {
	Code    uint32
	Message string
	// Reason, when not empty, is the reason of the errdetails.ErrorInfo
	// (domain ErrorDomain) the error carries.
	Reason string
	// RetryDelay, when positive, is the delay of the errdetails.RetryInfo
	// the error carries.
	RetryDelay time.Duration
	// Cause, when not nil, is the cause of the call's ended context: the
	// answer is the status of that context error, and the other fields are
	// unset.
	Cause error
}

// Outcome is what became of a call that Server.Run saw.
type Outcome[M, S any] struct {
	// Pass reports that the call carries no key and needs none: run the
	// handler unprotected.
	Pass bool
	// Ran reports that the handler ran: answer with its own answer.
	Ran bool
	// Refused, when not nil, is the answer of a call whose handler did not
	// run.
	Refused *Refusal
	// Otherwise the call replays the stored answer: Message, or Status when
	// IsStatus.
	Message  M
	Status   S
	IsStatus bool
}

// Run protects one unary call to method: it finds the call's key (the
// WithKeyFunc function's, else in values, the key header's values) and,
// for a call that has one, runs handle at most once per scope, method and
// key under idem.Do. handle runs the handler with ctx, which carries the
// Attempt, and returns the payload that stores its answer (Codec.RecordMessage,
// Codec.RecordError).
func (s *Server[M, S]) Run(ctx context.Context, method string, req any, values []string, handle func(ctx context.Context) ([]byte, error)) Outcome[M, S] {
	key, found, err := s.keyOf(ctx, req, values)
	if err != nil {
		return Outcome[M, S]{Refused: invalidKey(err)}
	}
	if !found {
		if s.cfg.required[method] {
			return Outcome[M, S]{Refused: &Refusal{Code: CodeInvalidArgument, Reason: ReasonKeyMissing,
				Message: "idem: this " + s.p.Method + " needs an idempotency key: create a unique key (a UUID) when the operation is created, send it in the " + s.p.KeyName + " " + s.p.KeyPlace + " and reuse it on every retry"}}
		}
		return Outcome[M, S]{Pass: true}
	}
	var scope string
	if s.cfg.scope != nil {
		if scope = s.cfg.scope(ctx); scope == "" {
			slog.ErrorContext(ctx, s.p.Package+": call refused: WithScope returned an empty scope; is authentication in front of the interceptor?", s.p.Method, method)
			return Outcome[M, S]{Refused: &Refusal{Code: CodeInternal, Reason: ReasonScopeMissing,
				Message: "idem: the server could not tell which account this call's idempotency key belongs to, so the call was not run"}}
		}
	}
	msg, ok := req.(M)
	if !ok {
		return Outcome[M, S]{Refused: &Refusal{Code: CodeInternal, Message: fmt.Sprintf("idem: request of type %T is not a protocol buffer message", req)}}
	}
	fp, err := s.codec.Fingerprint(method, msg)
	if err != nil {
		return Outcome[M, S]{Refused: &Refusal{Code: CodeInternal, Message: "idem: " + err.Error()}}
	}

	ran := false
	payload, err := idem.Do(ctx, s.g, OpKey(scope, method, key), fp, func(ctx context.Context, a *idem.Attempt) ([]byte, error) {
		ran = true
		return handle(idem.ContextWithAttempt(ctx, a))
	})
	switch {
	case ran:
		// Stored, released or not recorded (the Guard logged that): the
		// handler's own answer.
		return Outcome[M, S]{Ran: true}
	case err != nil:
		return Outcome[M, S]{Refused: s.refuse(ctx, method, err)}
	}
	m, st, isStatus, err := s.codec.Decode(payload)
	if err != nil {
		slog.ErrorContext(ctx, s.p.Package+": stored answer does not decode", s.p.Method, method, "err", err)
		return Outcome[M, S]{Refused: &Refusal{Code: CodeInternal, Reason: ReasonStoredUnreadable,
			Message: "idem: this call was already run, but its stored answer cannot be read; do not retry it, look up the outcome of the operation instead"}}
	}
	return Outcome[M, S]{Message: m, Status: st, IsStatus: isStatus}
}

// keyOf returns the call's key and whether it has one, or an error wrapping
// idem.ErrInvalidKey.
func (s *Server[M, S]) keyOf(ctx context.Context, req any, values []string) (key string, found bool, err error) {
	if s.cfg.keyFunc != nil {
		if k, ok := s.cfg.keyFunc(ctx, req); ok {
			if err := wire.ValidKey(k); err != nil {
				return "", false, err
			}
			return k, true, nil
		}
	}
	return ReadKey(values, s.p.KeyName)
}

func invalidKey(err error) *Refusal {
	return &Refusal{Code: CodeInvalidArgument, Reason: ReasonKeyInvalid,
		Message: err.Error() + "; send 1 to 255 printable ASCII characters, a UUID is recommended"}
}

// refuse returns the answer to a call whose handler did not run because
// idem.Do returned err.
func (s *Server[M, S]) refuse(ctx context.Context, method string, err error) *Refusal {
	switch {
	case errors.Is(err, idem.ErrMismatch):
		return &Refusal{Code: CodeInvalidArgument, Reason: ReasonKeyReused,
			Message: "idem: this idempotency key was already used with a different request; use a new key for a new operation, reuse a key only to retry exactly the same call"}
	case errors.Is(err, idem.ErrInProgress):
		d := s.cfg.retry
		if e, ok := errors.AsType[*idem.InProgressError](err); ok {
			d = max(min(d, e.RetryAfter), time.Millisecond)
		}
		return &Refusal{Code: CodeAborted, Reason: ReasonInProgress, RetryDelay: d,
			Message: "idem: a call with this idempotency key is still running; retry after the RetryInfo delay with the same key to get its answer"}
	case ctx.Err() != nil:
		return &Refusal{Cause: context.Cause(ctx)}
	case errors.Is(err, idem.ErrInvalidKey):
		return invalidKey(err)
	case errors.Is(err, idem.ErrStoreUnavailable):
		return &Refusal{Code: CodeUnavailable, Reason: ReasonStoreUnavailable,
			Message: "idem: the idempotency store is unreachable, so the call was not run; retry with the same key"}
	}
	slog.ErrorContext(ctx, s.p.Package+": call refused", s.p.Method, method, "err", err)
	return &Refusal{Code: CodeInternal, Message: err.Error()}
}
