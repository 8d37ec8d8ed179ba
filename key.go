package idem

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sync"
)

// onceFingerprint is the fingerprint of every Once id: a message id stands
// for one message.
var onceFingerprint = fingerprint(nil)

// fingerprint returns the first 128 bits of the SHA-256 of b, base64url encoded.
func fingerprint(b []byte) string {
	sum := sha256.Sum256(b)
	return base64.RawURLEncoding.EncodeToString(sum[:16])
}

// requestFingerprint fingerprints req's canonical JSON: object keys sorted,
// no insignificant whitespace, numbers as encoded.
func requestFingerprint(req any) (string, error) {
	e := jsonEncoders.Get().(*jsonEncoder)
	defer e.done()
	if err := e.enc.Encode(req); err != nil {
		return "", fmt.Errorf("idem: request is not JSON-encodable: %w", err)
	}
	b := e.buf.Bytes()
	b = b[:len(b)-1] // Encode's newline: the rest is json.Marshal's output
	if len(b) > 0 && (b[0] == '{' || b[0] == '[') {
		// Structs marshal in field order, maps in key order: canonicalise
		// so that equal JSON documents fingerprint equally, also across a
		// deploy that reorders a struct's fields.
		if fp, ok := canonicalPrint(b, len(b), func(dst []byte) []byte { return dst }); ok {
			return fp, nil
		}
	}
	return fingerprint(b), nil
}

// jsonEncoder encodes requests and results into a buffer reused across
// calls.
type jsonEncoder struct {
	buf bytes.Buffer
	enc *json.Encoder
}

var jsonEncoders = sync.Pool{New: func() any {
	e := new(jsonEncoder)
	e.enc = json.NewEncoder(&e.buf)
	return e
}}

// done returns e to the pool, unless a large value grew its buffer.
func (e *jsonEncoder) done() {
	if e.buf.Cap() <= maxPooledBuffer {
		e.buf.Reset()
		jsonEncoders.Put(e)
	}
}

// newToken returns a fresh owner token: 48 random bits, base64url encoded.
// It only needs to differ between the claims of one key while its record
// lives, and it is kept in every record.
func newToken() string {
	var b [6]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}
