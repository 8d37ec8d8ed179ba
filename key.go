package idem

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
)

// maxKeyLen is the longest key accepted, in bytes.
const maxKeyLen = 255

// validKey reports why key is not a valid idempotency key, wrapping
// ErrInvalidKey, or nil when it is valid.
func validKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > maxKeyLen:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidKey, len(key), maxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: byte %#x at %d is not printable ASCII", ErrInvalidKey, c, i)
		}
	}
	return nil
}

// parseKey returns the key in a header value: the value itself, or the
// content of an RFC 8941 string ("quoted", with \" and \\ escapes).
func parseKey(v string) (string, error) {
	if len(v) == 0 || v[0] != '"' {
		return v, validKey(v)
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
			return key, validKey(key)
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

// newToken returns a fresh owner token: 48 random bits, base64url encoded.
// It only needs to differ between the claims of one key while its record
// lives, and it is kept in every record.
func newToken() string {
	var b [6]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}
