// Package rpcidem is the one implementation behind idem's gRPC and Connect
// interceptors (the modules contrib/idemgrpc and contrib/idemconnect): how a
// call's key is read and turned into an operation key, what is fingerprinted,
// how an answer is stored, which status codes are stored, what a refused call
// is answered with, and when the client retries. Because both modules use it,
// a service served through both shares its records.
//
// It depends on neither gRPC, Connect nor protocol buffers, so that the core
// module does not either: each module passes its protobuf functions in (a
// Codec) and turns a Refusal into its own error type. gRPC and Connect number
// their status codes alike, so codes here are plain numbers.
package rpcidem

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"

	"github.com/idemkit/idem/internal/wire"
)

// ErrorDomain is the domain of the errdetails.ErrorInfo that idem's own
// errors carry.
const ErrorDomain = "github.com/idemkit/idem"

// Reasons of the errdetails.ErrorInfo that idem's own errors carry. The
// modules export them under the same names.
const (
	ReasonKeyMissing       = "IDEMPOTENCY_KEY_MISSING"
	ReasonKeyInvalid       = "IDEMPOTENCY_KEY_INVALID"
	ReasonKeyReused        = "IDEMPOTENCY_KEY_REUSED"
	ReasonInProgress       = "IDEMPOTENCY_KEY_IN_PROGRESS"
	ReasonStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
	ReasonScopeMissing     = "IDEMPOTENCY_SCOPE_MISSING"
	ReasonStoredUnreadable = "IDEMPOTENCY_STORED_ANSWER_UNREADABLE"
)

// Status codes, numbered as gRPC and Connect number them.
const (
	CodeInvalidArgument    uint32 = 3
	CodeNotFound           uint32 = 5
	CodeAlreadyExists      uint32 = 6
	CodePermissionDenied   uint32 = 7
	CodeFailedPrecondition uint32 = 9
	CodeAborted            uint32 = 10
	CodeOutOfRange         uint32 = 11
	CodeUnimplemented      uint32 = 12
	CodeInternal           uint32 = 13
	CodeUnavailable        uint32 = 14
)

// StoredCode reports whether an error with this status code is the call's
// final answer, stored and replayed: InvalidArgument, NotFound,
// AlreadyExists, PermissionDenied, FailedPrecondition, OutOfRange and
// Unimplemented.
func StoredCode(code uint32) bool {
	switch code {
	case CodeInvalidArgument, CodeNotFound, CodeAlreadyExists, CodePermissionDenied,
		CodeFailedPrecondition, CodeOutOfRange, CodeUnimplemented:
		return true
	}
	return false
}

// ReadKey returns the key carried by a call's key header (metadata) values, and
// whether there is one. A value in double quotes is an RFC 8941 string, read
// as idem's HTTP middleware reads it. Errors wrap idem.ErrInvalidKey: an
// invalid key, or the header, named name, sent more than once.
func ReadKey(values []string, name string) (key string, found bool, err error) {
	switch len(values) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", false, fmt.Errorf("%w: %s sent %d times", wire.ErrInvalidKey, name, len(values))
	}
	if key, err = wire.ParseKey(values[0]); err != nil {
		return "", false, err
	}
	return key, true, nil
}

// OpKey returns the key given to idem.Do for the client's key under scope
// and method (the full method, "/pkg.Service/Method"):
// "rpc:<len(scope)>:<scope>:<len(method)>:<method>:<key>", unambiguous
// because both lengths are written. When that is longer than 255 bytes or
// not printable ASCII (a scope may be anything), it is
// "rpc#<base64url(SHA-256(that))>" instead. Both forms start apart from each
// other; keep "rpc:" and "rpc#" for this use in your own idem.Do keys.
func OpKey(scope, method, key string) string {
	n := len(scope) + len(method) + len(key) + 32
	b := make([]byte, 0, n)
	b = append(b, "rpc:"...)
	b = strconv.AppendInt(b, int64(len(scope)), 10)
	b = append(b, ':')
	b = append(b, scope...)
	b = append(b, ':')
	b = strconv.AppendInt(b, int64(len(method)), 10)
	b = append(b, ':')
	b = append(b, method...)
	b = append(b, ':')
	b = append(b, key...)
	if len(b) <= wire.MaxKeyLen && wire.ValidKey(string(b)) == nil {
		return string(b)
	}
	sum := sha256.Sum256(b)
	return "rpc#" + base64.RawURLEncoding.EncodeToString(sum[:])
}
