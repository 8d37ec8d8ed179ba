package idem

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"hash"
	"net/http"
	"strings"

	"github.com/idemkit/idem/internal/canonjson"
)

// The fingerprints of requests: Do's request value and the middleware's
// HTTP request, both SHA-256 over a canonical form, and the pooled buffers
// they use.

// onceFingerprint is the fingerprint of every Once id: a message id stands
// for one message.
var onceFingerprint = hash128(nil)

// print128 is a request's fingerprint: the first 128 bits of the SHA-256 of
// its canonical bytes. The store gets it base64url encoded (printLen
// characters), written by idAndToken into the string of the operation's id.
type print128 [16]byte

// printLen is the length of an encoded print128.
const printLen = 22

// hash128 returns the fingerprint of a request from its canonical bytes b.
func hash128(b []byte) print128 {
	sum := sha256.Sum256(b)
	return print128(sum[:16])
}

// String returns p base64url encoded, as the store gets it.
func (p print128) String() string { return base64.RawURLEncoding.EncodeToString(p[:]) }

// requestFingerprint fingerprints req's canonical JSON: object keys sorted,
// no insignificant whitespace, numbers as encoded.
func requestFingerprint(req any) (print128, error) {
	e := jsonEncoders.get()
	defer e.done()
	if err := e.enc.Encode(req); err != nil {
		return print128{}, fmt.Errorf("idem: request is not JSON-encodable: %w", err)
	}
	b := e.buf.Bytes()
	b = b[:len(b)-1] // Encode's newline: the rest is json.Marshal's output, never empty
	if b[0] == '{' || b[0] == '[' {
		// Structs marshal in field order, maps in key order: canonicalise
		// so that equal JSON documents fingerprint equally, also across a
		// deploy that reorders a struct's fields.
		if fp, ok := canonicalPrint(b, len(b), func(dst []byte) []byte { return dst }); ok {
			return fp, nil
		}
	}
	return hash128(b), nil
}

// jsonEncoder encodes requests and results into a buffer reused across
// calls.
type jsonEncoder struct {
	buf bytes.Buffer
	enc *json.Encoder
}

var jsonEncoders = pool[*jsonEncoder]{fresh: func() *jsonEncoder {
	e := new(jsonEncoder)
	e.enc = json.NewEncoder(&e.buf)
	return e
}}

// done returns e to the pool, unless a large value grew its buffer.
func (e *jsonEncoder) done() {
	if e.buf.Cap() <= maxPooledBuffer {
		e.buf.Reset()
		jsonEncoders.put(e)
	}
}

// Fingerprint modes: how the body entered the fingerprint.
const (
	modeBytes byte = 'b' // byte for byte
	modeJSON  byte = 'j' // canonical JSON
)

// requestPrint fingerprints a request: method, escaped path, raw query and
// body. A JSON body (by Content-Type) that parses is fingerprinted in
// canonical form; any other body byte for byte.
func requestPrint(r *http.Request, path string, body []byte) print128 {
	size := len(r.Method) + len(path) + len(r.URL.RawQuery) + 4 + len(body)
	if len(body) > 0 && isJSON(r.Header.Get("Content-Type")) {
		head := func(b []byte) []byte { return appendRequestHead(b, r, path, modeJSON) }
		if fp, ok := canonicalPrint(body, size, head); ok {
			return fp
		}
	}
	p := printers.get()
	p.h.Reset()
	p.head = appendRequestHead(p.head[:0], r, path, modeBytes)
	p.h.Write(p.head)
	p.h.Write(body)
	fp := print128(p.h.Sum(p.sum[:0])[:16])
	if cap(p.head) <= maxPooledBuffer {
		printers.put(p)
	}
	return fp
}

// printer hashes a request's head and body without joining them: fingerprint
// of their concatenation.
type printer struct {
	h    hash.Hash
	head []byte
	sum  [sha256.Size]byte
}

var printers = pool[*printer]{fresh: func() *printer { return &printer{h: sha256.New()} }}

// appendRequestHead appends the fingerprinted head of a request: method,
// escaped path and raw query, each ended by a newline, and the body's mode.
func appendRequestHead(b []byte, r *http.Request, path string, mode byte) []byte {
	b = append(b, r.Method...)
	b = append(b, '\n')
	b = append(b, path...)
	b = append(b, '\n')
	b = append(b, r.URL.RawQuery...)
	return append(b, '\n', mode)
}

// canonicalPrint fingerprints head followed by the canonical form of the
// JSON document src, and reports false when src is not one it
// canonicalises. head appends to its argument; size bounds the result.
func canonicalPrint(src []byte, size int, head func([]byte) []byte) (print128, bool) {
	c := canonicalizers.get()
	out, ok := c.Append(head(c.Buffer(size)), src)
	var fp print128
	if ok {
		fp = hash128(out)
	}
	c.Reset(out)
	if c.Small(maxPooledBuffer) {
		canonicalizers.put(c)
	}
	return fp, ok
}

// canonicalizers are reused, buffers and all, up to maxPooledBuffer.
var canonicalizers = pool[*canonjson.Canonicalizer]{fresh: func() *canonjson.Canonicalizer { return new(canonjson.Canonicalizer) }}

const maxPooledBuffer = 64 << 10

// isJSON reports whether a Content-Type is JSON: application/json or a
// +json suffix, with any parameters.
func isJSON(ct string) bool {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	ct = strings.TrimSpace(ct)
	return strings.EqualFold(ct, "application/json") ||
		(len(ct) > 5 && strings.EqualFold(ct[len(ct)-5:], "+json"))
}
