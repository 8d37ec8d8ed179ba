// Package wire holds what idem's HTTP middleware, its HTTP client
// (idemclient) and its RPC interceptors agree on: the header that carries
// the idempotency key, what a valid key is, how a key is quoted and read
// back, and the problem type of a request that is still in progress. It
// imports only the standard library, so that idemclient can use it without
// linking go-redis.
package wire

import (
	"errors"
	"fmt"
	"strings"
)

// KeyHeader is the request header that carries the idempotency key, as
// named by the IETF draft "The Idempotency-Key HTTP Header Field".
const KeyHeader = "Idempotency-Key"

// ReplayedHeader is the response header, set to "true", that marks a
// replayed response.
const ReplayedHeader = "Idempotent-Replayed"

// MaxKeyLen is the length of the longest valid key, in bytes.
const MaxKeyLen = 255

// ErrInvalidKey reports a key that is empty, longer than MaxKeyLen bytes, or
// not printable ASCII. The root package exports it as idem.ErrInvalidKey.
var ErrInvalidKey = errors.New("idem: invalid key")

// ProblemContentType is the media type of a problem (RFC 9457).
const ProblemContentType = "application/problem+json"

// InProgressProblem is the type of the problem the middleware answers a
// duplicate with while the first request with its key still runs; clients
// match it to tell that 409 from a handler's own.
const InProgressProblem = "https://github.com/idemkit/idem/blob/main/docs/http.md#in-progress"

// ValidKey reports why key is not a valid idempotency key, wrapping
// ErrInvalidKey, or nil when it is valid.
func ValidKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: byte %#x at %d is not printable ASCII", ErrInvalidKey, c, i)
		}
	}
	return nil
}

// ParseKey returns the key in a header value: the value itself, or the
// content of an RFC 8941 string ("quoted", with \" and \\ escapes). Errors
// wrap ErrInvalidKey.
func ParseKey(v string) (string, error) {
	if len(v) == 0 || v[0] != '"' {
		return v, ValidKey(v)
	}
	var (
		b       []byte // only when the string has escapes
		escaped bool
	)
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", fmt.Errorf("%w: invalid escape in quoted string", ErrInvalidKey)
			}
			if !escaped {
				escaped = true
				b = append(make([]byte, 0, len(v)), v[1:i-1]...)
			}
			b = append(b, v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", fmt.Errorf("%w: text after the closing quote", ErrInvalidKey)
			}
			key := v[1:i]
			if escaped {
				key = string(b)
			}
			return key, ValidKey(key)
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%w: byte %#x is not printable ASCII", ErrInvalidKey, c)
		default:
			if escaped {
				b = append(b, c)
			}
		}
	}
	return "", fmt.Errorf("%w: quoted string without a closing quote", ErrInvalidKey)
}

// QuoteKey returns key as an RFC 8941 string: in double quotes, with
// backslash and double quote escaped. ParseKey reads it back.
func QuoteKey(key string) string {
	if !strings.ContainsAny(key, `"\`) {
		return `"` + key + `"`
	}
	var b strings.Builder
	b.Grow(len(key) + 4)
	b.WriteByte('"')
	for i := 0; i < len(key); i++ {
		if c := key[i]; c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(key[i])
	}
	b.WriteByte('"')
	return b.String()
}

// IsToken reports whether s is an RFC 9110 token: one or more tchar, as
// method and header names are.
func IsToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !('a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0) {
			return false
		}
	}
	return true
}
