package idem

import (
	"crypto/rand"
	"encoding/base64"
)

// newToken returns a fresh owner token: 48 random bits, base64url encoded.
// It only needs to differ between the claims of one key while its record
// lives, and it is kept in every record.
func newToken() string {
	var out [tokenLen]byte
	return string(appendToken(out[:0]))
}

// appendToken appends a fresh owner token to b; see newToken.
func appendToken(b []byte) []byte {
	var r [6]byte
	rand.Read(r[:])
	return base64.RawURLEncoding.AppendEncode(b, r[:])
}
