package idem

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
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
	return operationID(kind, scope, key)
}

// Namespaces keep Do keys, Once ids and HTTP keys apart.
const (
	nsDo   byte = 'd'
	nsOnce byte = 'o'
	nsHTTP byte = 'h'
)

// operationID returns the stable, opaque id of the operation of kind, scope
// and key: the first 128 bits of the SHA-256 of the kind's namespace, the
// scope and the key, base64url encoded (22 characters). Hashing keeps any
// key out of another's key space and gives every Redis key of the operation
// one hash tag.
func operationID(kind Kind, scope, key string) string {
	var out [idLen]byte
	return string(appendOperationID(out[:0], kind, scope, key))
}

// idLen is the length of an operation's id, tokenLen of an owner token.
const (
	idLen    = 22
	tokenLen = 8
)

// appendOperationID appends the id of the operation of kind, scope and key
// to b; see operationID.
func appendOperationID(b []byte, kind Kind, scope, key string) []byte {
	var buf [128]byte
	h := append(buf[:0], kind.namespace())
	h = binary.BigEndian.AppendUint64(h, uint64(len(scope)))
	h = append(h, scope...)
	h = append(h, key...)
	sum := sha256.Sum256(h)
	return base64.RawURLEncoding.AppendEncode(b, sum[:16])
}
