package idem

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"time"
)

// Kind is the kind of an operation: what ran it. Each kind has a key space of
// its own, so equal keys of two kinds never meet.
type Kind int

// Kinds of operations.
const (
	KindDo   Kind = iota + 1 // a key passed to Do
	KindOnce                 // a message id passed to Guard.Once
	KindHTTP                 // an idempotency key under Guard.Middleware
)

// String returns the kind's name: "do", "once" or "http".
func (k Kind) String() string {
	switch k {
	case KindDo:
		return "do"
	case KindOnce:
		return "once"
	case KindHTTP:
		return "http"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// namespace returns the kind's namespace byte in operation ids, 0 for an
// unknown kind.
func (k Kind) namespace() byte {
	switch k {
	case KindDo:
		return nsDo
	case KindOnce:
		return nsOnce
	case KindHTTP:
		return nsHTTP
	}
	return 0
}

// OperationID returns the id of an operation (its Attempt.ID) from what its
// caller knows: the kind, the scope and the key. The id names the
// operation's Redis keys (RedisStore.Keys) and is what Inspect and Forget
// take. It returns "" for an unknown kind.
//
// Do and Once have no scope: pass "". For KindHTTP, scope is what the
// WithScope function returned for the request ("" without WithScope), and
// key is the Idempotency-Key as the middleware reads it: a quoted value
// (RFC 8941) without its quotes and escapes, so that "abc" and abc name one
// operation.
func OperationID(kind Kind, scope, key string) string {
	if kind.namespace() == 0 {
		return ""
	}
	return op{kind: kind, scope: scope, key: key}.id()
}

// Namespaces keep Do keys, Once ids and HTTP keys apart.
const (
	nsDo   byte = 'd'
	nsOnce byte = 'o'
	nsHTTP byte = 'h'
)

// op names one logical operation: a key of a kind and a scope, and the
// fingerprint of the request it stands for.
type op struct {
	kind  Kind
	scope string
	key   string
	fp    string
	// detach runs fn on a context without the caller's cancellation: the
	// claim and any wait still end with the caller's context, fn does not.
	detach bool
	// wait is how long a duplicate waits for the holder's result (WithWait).
	wait time.Duration
	// obs is the operation's report to the Guard's Observer, or nil.
	obs *observation
	// retention, when positive, is kept by the op's records instead of the
	// Guard's retention (WithRouteRetention).
	retention time.Duration
}

// id returns the operation's stable, opaque id: the first 128 bits of the
// SHA-256 of its kind's namespace, scope and key, base64url encoded (22
// characters).
// Hashing keeps any key out of another's key space and gives every Redis key
// of the operation one hash tag.
func (o op) id() string {
	var buf [128]byte
	b := append(buf[:0], o.kind.namespace())
	b = binary.BigEndian.AppendUint64(b, uint64(len(o.scope)))
	b = append(b, o.scope...)
	b = append(b, o.key...)
	sum := sha256.Sum256(b)
	return base64.RawURLEncoding.EncodeToString(sum[:16])
}
