package idemclient

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"github.com/idemkit/idem/internal/wire"
)

// ErrInvalidKey reports a key that is empty, longer than 255 bytes, or not
// printable ASCII, or one that WithBareKey cannot send. It is the same error
// value as idem.ErrInvalidKey, so either matches under errors.Is.
var ErrInvalidKey = wire.ErrInvalidKey

// ReplayedHeader is the response header, set to "true", with which a server
// behind idem's middleware marks a replayed response: the stored answer of
// the first request with the key, not a new run. It equals
// idem.ReplayedHeader.
const ReplayedHeader = wire.ReplayedHeader

// NewKey returns a new idempotency key: a random UUID (version 4, 122 bits
// from crypto/rand) in its 36-character text form. Create one when the
// user's intent is created (the Pay button is shown, the form is opened), keep
// it with the intent, and send it on every retry of that intent.
func NewKey() string {
	var u [16]byte
	rand.Read(u[:])         // never fails; crashes the program if the system has no randomness
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:], u[10:])
	return string(s[:])
}

type keyContextKey struct{}

// WithKey returns a copy of ctx carrying key, the idempotency key that a
// transport made by NewTransport sends with a request made with that context.
// Use it to keep one key across calls that are retries of one intent: the app
// restarted, the user pressed Pay again, or a library that retries on its own
// (go-retryablehttp, resty) calls the transport again. Without it each call
// gets a new key.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContextKey{}, key)
}

// KeyFrom returns the idempotency key set on ctx by WithKey, for clients
// other than NewTransport's (a gRPC interceptor, a message producer) that
// attach the caller's key to what they send. On the context of a request
// that NewTransport sent, such as resp.Request.Context(), it returns the
// key the transport used, as created: unquoted, also when the transport
// made it with NewKey or took it from the request's own header.
func KeyFrom(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyContextKey{}).(string)
	return k, ok
}
