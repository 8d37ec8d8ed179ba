// Package idemwatermill makes watermill message handlers run once per
// message, across redeliveries and across every consumer sharing one idem
// store, and re-emit the same output messages on a redelivery.
//
//	g := idem.New(idem.NewRedisStore(rdb), idem.WithWait(10*time.Second))
//	router.AddMiddleware(idemwatermill.Middleware(g))
//
// Middleware runs the handler under idem.Do keyed by the message UUID (or a
// metadata field: WithKeyMetadata; or an id in the payload: WithKeyFunc)
// and stores the messages the handler
// returns. The router publishes them and then acknowledges the message; if
// publishing fails, or the acknowledgement is lost, the broker redelivers
// the message, and the middleware returns the same output messages again
// (same UUIDs, metadata and payloads) without running the handler, so that a
// downstream consumer deduplicating by UUID sees each output once.
//
// What a delivery gets:
//
//   - First delivery: the handler runs once; its output messages are stored
//     (for the Guard's retention) and returned.
//   - Redelivery after the handler succeeded: the stored output messages; the
//     handler does not run.
//   - Redelivery while the first delivery's handler still runs: with the
//     Guard's WithWait, it waits for that result and returns the same output
//     messages; without it (or when the wait runs out) it returns an error
//     satisfying errors.Is(err, idem.ErrInProgress), so the router nacks it
//     and the broker redelivers it later.
//   - The handler returns an error or panics: the key is released and the
//     error (or the panic) goes to the router, which nacks; the redelivery
//     runs the handler again, with Attempt.Fence one higher. An error wrapped
//     with idem.Permanent is stored instead: every redelivery gets it back
//     without running the handler (route such messages to a poison queue).
//   - No key (an empty UUID, an empty metadata field, WithKeyFunc's function
//     failing or finding none): ErrNoKey, and the handler does not run. A
//     key idem refuses (over 255 bytes, not printable ASCII): an error
//     satisfying errors.Is(err, idem.ErrInvalidKey).
//   - The same key with another payload (another fingerprint, under
//     WithFingerprint): an error satisfying errors.Is(err, idem.ErrMismatch),
//     never the other message's outputs.
//   - The store is unreachable: an error satisfying
//     errors.Is(err, idem.ErrStoreUnavailable); the handler does not run.
//   - The handler ran but its outputs could not be stored (idem.ErrNotRecorded,
//     logged by the Guard): its outputs are returned all the same, so they
//     are published and the message acknowledged.
//
// A message is "the same" when its payload is: the fingerprint is the
// SHA-256 of the payload (or of the bytes WithFingerprint's function
// returns). Metadata is left out, since brokers and middleware add delivery
// details to it.
//
// Keys are scoped by the router's handler name (message.HandlerNameFromCtx):
// two handlers consuming the same message (fan-out) each run once. The
// Attempt's key is "<handler name>/<message key>", or the message key alone
// outside a router. The handler finds its Attempt with
// AttemptFrom(msg.Context()).
package idemwatermill

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/idem"
)

// ErrNoKey reports a message without an idempotency key: an empty UUID, or an
// empty metadata field under WithKeyMetadata. Such a message is refused, never
// processed unprotected.
var ErrNoKey = errors.New("idemwatermill: message has no idempotency key")

// An Option configures Middleware.
type Option func(*config)

type config struct {
	field       string // metadata field holding the key; "" for the UUID
	keyFunc     func(*message.Message) (string, error)
	fingerprint func(*message.Message) ([]byte, error)
}

// WithKeyMetadata keys messages by the named metadata field instead of the
// message UUID, for producers that give a retried message a new UUID but
// carry a stable business id (an order id, an event id). Default: the UUID.
func WithKeyMetadata(field string) Option {
	return func(c *config) {
		if field == "" {
			panic("idemwatermill: WithKeyMetadata with an empty field name")
		}
		c.field = field
	}
}

// WithKeyFunc keys messages by what f returns for them instead of the
// message UUID: an id in the payload, for producers that give a redelivered
// event a new UUID (a webhook relayed to a queue, Stripe's event id).
// idem.KeyFromJSON reads a member of a JSON payload:
//
//	id := idem.KeyFromJSON("/id")
//	idemwatermill.WithKeyFunc(func(m *message.Message) (string, error) { return id(nil, m.Payload) })
//
// An error from f, or an empty key, is ErrNoKey (wrapping f's error) and
// the handler does not run. It cannot be combined with WithKeyMetadata, and
// a nil f panics.
func WithKeyFunc(f func(*message.Message) (string, error)) Option {
	return func(c *config) {
		if f == nil {
			panic("idemwatermill: WithKeyFunc(nil)")
		}
		c.keyFunc = f
	}
}

// WithFingerprint sets what is compared between deliveries with one key:
// the bytes f returns for a message, instead of its whole payload. Use it
// when a producer changes a field of the payload on each delivery of one
// event (an attempt count, a sent-at time); idem.FingerprintJSON compares
// chosen members of a JSON payload:
//
//	fp := idem.FingerprintJSON("/type", "/data")
//	idemwatermill.WithFingerprint(func(m *message.Message) ([]byte, error) { return fp(nil, m.Payload) })
//
// Equal bytes are a redelivery, others an error satisfying
// errors.Is(err, idem.ErrMismatch). An error from f is returned (wrapped)
// and the handler does not run. A nil f panics.
func WithFingerprint(f func(*message.Message) ([]byte, error)) Option {
	return func(c *config) {
		if f == nil {
			panic("idemwatermill: WithFingerprint(nil)")
		}
		c.fingerprint = f
	}
}

// Middleware returns watermill handler middleware that runs each message's
// handler at most once per key and replays its output messages to
// redeliveries; see the package documentation for what each delivery gets.
//
// Middleware panics on a nil Guard or an invalid option, at construction.
func Middleware(g *idem.Guard, opts ...Option) message.HandlerMiddleware {
	if g == nil {
		panic("idemwatermill: Middleware with a nil Guard")
	}
	var c config
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.field != "" && c.keyFunc != nil {
		panic("idemwatermill: Middleware: WithKeyMetadata and WithKeyFunc: the key is taken from one place; give one of them")
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			return c.handle(g, h, msg)
		}
	}
}

// handle runs one delivery.
func (c *config) handle(g *idem.Guard, h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	id, err := c.keyOf(msg)
	if err != nil {
		return nil, err
	}
	key := id
	if name := message.HandlerNameFromCtx(msg.Context()); name != "" {
		key = name + "/" + id
	}
	fp, err := c.fingerprintOf(msg)
	if err != nil {
		return nil, err
	}

	var produced []*message.Message
	ran := false
	stored, err := idem.Do(msg.Context(), g, key, fp,
		func(ctx context.Context, a *idem.Attempt) ([]storedMessage, error) {
			ran = true
			outer := msg.Context()
			msg.SetContext(context.WithValue(ctx, attemptKey{}, a))
			defer msg.SetContext(outer)
			out, err := h(msg)
			if err != nil {
				return nil, err
			}
			produced = out
			return encode(out), nil
		})
	switch {
	case err == nil && ran:
		return produced, nil
	case err == nil:
		return decode(stored), nil
	case ran && errors.Is(err, idem.ErrNotRecorded):
		return produced, nil // logged by the Guard; publish what the handler made
	case ran:
		return nil, err // the handler's own error
	}
	return nil, fmt.Errorf("idemwatermill: message %q (key %q): %w", msg.UUID, key, err)
}

// keyOf returns msg's key, or an error wrapping ErrNoKey.
func (c *config) keyOf(msg *message.Message) (string, error) {
	switch {
	case c.keyFunc != nil:
		id, err := c.keyFunc(msg)
		if err != nil {
			return "", fmt.Errorf("%w: message %q: %w", ErrNoKey, msg.UUID, err)
		}
		if id == "" {
			return "", fmt.Errorf("%w: WithKeyFunc's function found none in message %q", ErrNoKey, msg.UUID)
		}
		return id, nil
	case c.field != "":
		id := msg.Metadata.Get(c.field)
		if id == "" {
			return "", fmt.Errorf("%w: metadata field %q of message %q is empty", ErrNoKey, c.field, msg.UUID)
		}
		return id, nil
	case msg.UUID == "":
		return "", fmt.Errorf("%w: the message UUID is empty", ErrNoKey)
	}
	return msg.UUID, nil
}

// fingerprintOf returns what is compared of msg: the SHA-256 of its
// payload, or of WithFingerprint's bytes (marked apart, so that the two
// never compare equal).
func (c *config) fingerprintOf(msg *message.Message) (string, error) {
	if c.fingerprint == nil {
		sum := sha256.Sum256(msg.Payload)
		return hex.EncodeToString(sum[:]), nil
	}
	b, err := c.fingerprint(msg)
	if err != nil {
		return "", fmt.Errorf("idemwatermill: message %q: fingerprint: %w", msg.UUID, err)
	}
	sum := sha256.Sum256(b)
	return "f:" + hex.EncodeToString(sum[:]), nil
}

type attemptKey struct{}

// AttemptFrom returns the Attempt of the delivery that a handler under
// Middleware is processing, from msg.Context(), and reports whether there is
// one. Pass Attempt.ID to external providers as their idempotency key; when
// Attempt.Fence > 1 an earlier delivery started and did not finish.
func AttemptFrom(ctx context.Context) (*idem.Attempt, bool) {
	a, ok := ctx.Value(attemptKey{}).(*idem.Attempt)
	return a, ok
}

// storedMessage is an output message as stored.
type storedMessage struct {
	UUID     string            `json:"uuid"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Payload  []byte            `json:"payload,omitempty"`
}

func encode(msgs []*message.Message) []storedMessage {
	out := make([]storedMessage, 0, len(msgs))
	for _, m := range msgs {
		if m == nil {
			continue
		}
		out = append(out, storedMessage{UUID: m.UUID, Metadata: m.Metadata, Payload: m.Payload})
	}
	return out
}

func decode(stored []storedMessage) []*message.Message {
	if len(stored) == 0 {
		return nil
	}
	out := make([]*message.Message, len(stored))
	for i, s := range stored {
		m := message.NewMessage(s.UUID, s.Payload)
		for k, v := range s.Metadata {
			m.Metadata.Set(k, v)
		}
		out[i] = m
	}
	return out
}
