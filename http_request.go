package idem

import (
	"io"
	"math"
	"net/http"
	"strconv"
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

// bodyRefused answers a request whose body readBody refused with status,
// and returns the outcome of the refusal ("" for status 0).
func (m *middleware) bodyRefused(w http.ResponseWriter, status int) Outcome {
	switch status {
	case http.StatusRequestEntityTooLarge:
		writeProblem(w, &probBodyTooLarge, "The request body is larger than "+strconv.FormatInt(m.maxRequest, 10)+" bytes.")
		return OutcomeTooLarge
	case http.StatusBadRequest:
		writeProblem(w, &probBodyUnreadable, "The request body could not be read completely. Send the request again with the same key.")
		return OutcomeInvalidKey
	}
	return ""
}

// firstBodyRead is the buffer for the first bytes of a body whose length is
// not known or larger: it doubles as bytes arrive.
const firstBodyRead = 512

// bodyBuffers hold request bodies between requests, up to maxPooledBuffer.
// A body goes back once no reader can reach its bytes: after the
// fingerprint when the handler does not run, or once the handler has read
// it to the end.
var bodyBuffers = pool[*[]byte]{fresh: func() *[]byte { return new([]byte) }}

// putBody returns bp to bodyBuffers, keeping body's array if it is the
// larger and not too large.
func putBody(bp *[]byte, body []byte) {
	if cap(body) > cap(*bp) && cap(body) <= maxPooledBuffer {
		*bp = body[:0]
	}
	bodyBuffers.put(bp)
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
