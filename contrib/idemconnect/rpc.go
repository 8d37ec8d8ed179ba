package idemconnect

// This file is the same in idemgrpc and idemconnect (only the package name
// differs), so that a service served by both shares its records: the same
// operation keys, fingerprints and stored payloads. It depends on neither
// gRPC nor Connect.

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idem"
)

// ErrorDomain is the domain of the errdetails.ErrorInfo that idem's own
// errors carry.
const ErrorDomain = "github.com/idemkit/idem"

// Reasons of the errdetails.ErrorInfo that idem's own errors carry; a client
// may branch on them.
const (
	// ReasonKeyMissing: a method named in WithRequiredKey was called without
	// a key (InvalidArgument).
	ReasonKeyMissing = "IDEMPOTENCY_KEY_MISSING"
	// ReasonKeyInvalid: the key is empty, longer than 255 bytes, not
	// printable ASCII, or sent twice (InvalidArgument).
	ReasonKeyInvalid = "IDEMPOTENCY_KEY_INVALID"
	// ReasonKeyReused: the key was first used with another request
	// (InvalidArgument). Do not retry: a new operation needs a new key.
	ReasonKeyReused = "IDEMPOTENCY_KEY_REUSED"
	// ReasonInProgress: the first call with this key still runs (Aborted,
	// with an errdetails.RetryInfo). Retry with the same key.
	ReasonInProgress = "IDEMPOTENCY_KEY_IN_PROGRESS"
	// ReasonStoreUnavailable: the idempotency store is unreachable, so the
	// call was not run (Unavailable). Retry with the same key.
	ReasonStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
	// ReasonScopeMissing: the server's WithScope returned "" (Internal).
	ReasonScopeMissing = "IDEMPOTENCY_SCOPE_MISSING"
	// ReasonStoredUnreadable: the call was already run but its stored answer
	// cannot be read (Internal). Do not retry; look up the outcome.
	ReasonStoredUnreadable = "IDEMPOTENCY_STORED_ANSWER_UNREADABLE"
)

const maxKeyLen = 255

// parseKey returns the key carried by a header (metadata) value: the value
// itself, or, when it starts with a double quote, the RFC 8941 string it
// holds (as idem's HTTP middleware reads it). Errors wrap idem.ErrInvalidKey.
func parseKey(v string) (string, error) {
	if strings.HasPrefix(v, `"`) {
		var b strings.Builder
		for i := 1; i < len(v); i++ {
			switch c := v[i]; {
			case c == '"':
				if i != len(v)-1 {
					return "", fmt.Errorf("%w: text after the closing quote", idem.ErrInvalidKey)
				}
				return b.String(), validKey(b.String())
			case c == '\\':
				if i++; i == len(v) || v[i] != '"' && v[i] != '\\' {
					return "", fmt.Errorf("%w: bad escape in a quoted string", idem.ErrInvalidKey)
				}
				b.WriteByte(v[i])
			case c < 0x20 || c > 0x7e:
				return "", fmt.Errorf("%w: byte %#x at %d is not printable ASCII", idem.ErrInvalidKey, c, i)
			default:
				b.WriteByte(c)
			}
		}
		return "", fmt.Errorf("%w: unterminated quoted string", idem.ErrInvalidKey)
	}
	return v, validKey(v)
}

// validKey reports why key is not a valid idempotency key (1 to 255 bytes of
// printable ASCII, as the core requires), wrapping idem.ErrInvalidKey.
func validKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", idem.ErrInvalidKey)
	case len(key) > maxKeyLen:
		return fmt.Errorf("%w: %d bytes, more than %d", idem.ErrInvalidKey, len(key), maxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: byte %#x at %d is not printable ASCII", idem.ErrInvalidKey, c, i)
		}
	}
	return nil
}

// opKey returns the key given to idem.Do for the client's key under scope
// and method (the full method, "/pkg.Service/Method"):
// "rpc:<len(scope)>:<scope>:<len(method)>:<method>:<key>", unambiguous
// because both lengths are written. When that is longer than 255 bytes or
// not printable ASCII (a scope may be anything), it is
// "rpc#<base64url(SHA-256(that))>" instead. Both forms start apart from each
// other; keep "rpc:" and "rpc#" for this use in your own idem.Do keys.
func opKey(scope, method, key string) string {
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
	if len(b) <= maxKeyLen && validKey(string(b)) == nil {
		return string(b)
	}
	sum := sha256.Sum256(b)
	return "rpc#" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// fingerprint returns what idem.Do fingerprints for a call: the SHA-256 of
// the full method and the request's deterministic protobuf encoding.
func fingerprint(method string, req proto.Message) (string, error) {
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		return "", fmt.Errorf("encoding the request: %w", err)
	}
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(method)))
	h.Write(n[:])
	h.Write([]byte(method))
	h.Write(body)
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil)), nil
}

// Tags of the stored payload: a response message, or a status.
const (
	tagMessage byte = 'm' // a google.protobuf.Any holding the response
	tagStatus  byte = 's' // a google.rpc.Status
)

var deterministic = proto.MarshalOptions{Deterministic: true}

// encodeMessage returns the payload storing a response: its type URL and
// deterministic encoding, in a google.protobuf.Any.
func encodeMessage(m proto.Message) ([]byte, error) {
	var a anypb.Any
	if err := anypb.MarshalFrom(&a, m, deterministic); err != nil {
		return nil, err
	}
	return deterministic.MarshalAppend([]byte{tagMessage}, &a)
}

// encodeStatus returns the payload storing an error: code, message and
// details.
func encodeStatus(st *spb.Status) ([]byte, error) {
	return deterministic.MarshalAppend([]byte{tagStatus}, st)
}

// decodePayload returns the stored response, or the stored status. A
// response's type must be linked into the program (protoregistry.GlobalTypes),
// as every generated message type is.
func decodePayload(p []byte) (proto.Message, *spb.Status, error) {
	if len(p) == 0 {
		return nil, nil, errors.New("empty payload")
	}
	switch p[0] {
	case tagMessage:
		var a anypb.Any
		if err := proto.Unmarshal(p[1:], &a); err != nil {
			return nil, nil, err
		}
		m, err := anypb.UnmarshalNew(&a, proto.UnmarshalOptions{})
		return m, nil, err
	case tagStatus:
		var st spb.Status
		if err := proto.Unmarshal(p[1:], &st); err != nil {
			return nil, nil, err
		}
		return nil, &st, nil
	}
	return nil, nil, fmt.Errorf("unknown payload tag %q", p[0])
}

// storedCode reports whether an error with this status code is the call's
// final answer, stored and replayed: InvalidArgument (3), NotFound (5),
// AlreadyExists (6), PermissionDenied (7), FailedPrecondition (9),
// OutOfRange (11) and Unimplemented (12). gRPC and Connect number their
// codes alike.
func storedCode(code uint32) bool {
	switch code {
	case 3, 5, 6, 7, 9, 11, 12:
		return true
	}
	return false
}

// errorInfo returns the details of one of idem's own errors.
func errorInfo(reason string) *errdetails.ErrorInfo {
	return &errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}
}

// retryInfo returns a RetryInfo asking the client to retry after d.
func retryInfo(d time.Duration) *errdetails.RetryInfo {
	return &errdetails.RetryInfo{RetryDelay: durationpb.New(d)}
}

// Backoff computes the client's waits: full jitter over a capped exponential.
type backoff struct {
	base, limit time.Duration
}

// jittered returns the wait before retry n (1 for the first retry), given a
// uniform random source over [0, n).
func (b backoff) jittered(retry int, rnd func(n int64) int64) time.Duration {
	ceil := b.base
	for i := 1; i < retry && ceil < b.limit; i++ {
		if ceil > b.limit/2 {
			ceil = b.limit
			break
		}
		ceil *= 2
	}
	ceil = min(ceil, b.limit)
	if ceil <= 0 {
		return 0
	}
	return time.Duration(rnd(int64(ceil)))
}

// withAttempt returns ctx carrying a for idem.AttemptFrom.
func withAttempt(ctx context.Context, a *idem.Attempt) context.Context {
	return idem.ContextWithAttempt(ctx, a)
}
