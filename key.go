package idem

import (
	"crypto/rand"
	"encoding/base64"
)

// newToken returns a fresh owner token: 48 random bits, base64url encoded.
// It only needs to differ between the claims of one key while its record
// lives, and it is kept in every record.
func newToken() string {
	var b [6]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}
