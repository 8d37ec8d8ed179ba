package idem

import (
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
)

// readBody reads r's body, up to max bytes, into buf (a buffer to reuse, of
// length 0, or nil). status is 413 when the body is larger than max, 400 when
// it could not be read, 0 otherwise. A buffer that is too small grows with
// the bytes that arrive: a client that announces a large Content-Length and
// sends little makes the server allocate little.
func readBody(r *http.Request, max int64, buf []byte) ([]byte, int) {
	if r.ContentLength > max {
		return nil, http.StatusRequestEntityTooLarge
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, 0
	}
	// want is where reading stops: the announced length, or one byte past
	// the limit.
	want := math.MaxInt
	if max < math.MaxInt {
		want = int(max) + 1
	}
	if r.ContentLength >= 0 {
		want = int(r.ContentLength)
	}
	if cap(buf) == 0 {
		buf = make([]byte, 0, min(want, firstBodyRead))
	}
	for len(buf) < want {
		if len(buf) == cap(buf) {
			grown := make([]byte, len(buf), min(2*cap(buf), want))
			copy(grown, buf)
			buf = grown
		}
		n, err := r.Body.Read(buf[len(buf):min(cap(buf), want)])
		buf = buf[:len(buf)+n]
		if err == io.EOF && (r.ContentLength < 0 || len(buf) == want) {
			break
		}
		if err != nil {
			return nil, http.StatusBadRequest // also a body shorter than announced
		}
	}
	if int64(len(buf)) > max {
		return nil, http.StatusRequestEntityTooLarge
	}
	return buf, 0
}

// firstBodyRead is the buffer for the first bytes of a body whose length is
// not known or larger: it doubles as bytes arrive.
const firstBodyRead = 512

// bodyBuffers hold request bodies between requests, up to maxPooledBuffer.
// A body goes back once no reader can reach its bytes: after the
// fingerprint when the handler does not run, or once the handler has read
// it to the end.
var bodyBuffers = sync.Pool{New: func() any { return new([]byte) }}

// putBody returns bp to bodyBuffers, keeping body's array if it is the
// larger and not too large.
func putBody(bp *[]byte, body []byte) {
	if cap(body) > cap(*bp) && cap(body) <= maxPooledBuffer {
		*bp = body[:0]
	}
	bodyBuffers.Put(bp)
}

// bodyReader hands the body, read once by the middleware, to the handler.
// Its position is atomic so that the middleware can tell, even while a
// goroutine of the handler still holds the body, whether any byte is left
// to read: once none is, the reader never touches the bytes again.
type bodyReader struct {
	b []byte
	i atomic.Int64
}

func (b *bodyReader) Read(p []byte) (int, error) {
	i := int(b.i.Load())
	if i >= len(b.b) {
		return 0, io.EOF
	}
	n := copy(p, b.b[i:])
	b.i.Store(int64(i + n))
	return n, nil
}

func (b *bodyReader) WriteTo(w io.Writer) (int64, error) {
	i := int(b.i.Load())
	n, err := w.Write(b.b[min(i, len(b.b)):])
	b.i.Store(int64(i + n))
	return int64(n), err
}

func (b *bodyReader) Close() error { return nil }

// drained reports whether every byte of the body has been read.
func (b *bodyReader) drained() bool { return int(b.i.Load()) >= len(b.b) }

// Fingerprint modes: how the body entered the fingerprint.
const (
	modeBytes byte = 'b' // byte for byte
	modeJSON  byte = 'j' // canonical JSON
)

// requestPrint fingerprints a request: method, escaped path, raw query and
// body. A JSON body (by Content-Type) that parses is fingerprinted in
// canonical form; any other body byte for byte.
func requestPrint(r *http.Request, path string, body []byte) string {
	size := len(r.Method) + len(path) + len(r.URL.RawQuery) + 4 + len(body)
	if len(body) > 0 && isJSON(r.Header.Get("Content-Type")) {
		head := func(b []byte) []byte { return appendRequestHead(b, r, path, modeJSON) }
		if fp, ok := canonicalPrint(body, size, head); ok {
			return fp
		}
	}
	p := printers.Get().(*printer)
	p.h.Reset()
	p.head = appendRequestHead(p.head[:0], r, path, modeBytes)
	p.h.Write(p.head)
	p.h.Write(body)
	fp := base64.RawURLEncoding.EncodeToString(p.h.Sum(p.sum[:0])[:16])
	if cap(p.head) <= maxPooledBuffer {
		printers.Put(p)
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

var printers = sync.Pool{New: func() any { return &printer{h: sha256.New()} }}

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
func canonicalPrint(src []byte, size int, head func([]byte) []byte) (string, bool) {
	c := canonicalizers.Get().(*canonicalizer)
	c.src = src
	if cap(c.dst) < size {
		c.dst = make([]byte, 0, size) // the canonical form is never longer
	}
	c.dst = head(c.dst[:0])
	out, ok := c.run()
	var fp string
	if ok {
		fp = fingerprint(out)
	}
	c.reset(out)
	if c.small(maxPooledBuffer) {
		canonicalizers.Put(c)
	}
	return fp, ok
}

// canonicalizers are reused, buffers and all, up to maxPooledBuffer.
var canonicalizers = sync.Pool{New: func() any { return new(canonicalizer) }}

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
