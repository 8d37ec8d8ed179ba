package idem

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
)

// recorder captures a handler's response the way httptest.ResponseRecorder
// does: the first WriteHeader wins, the first Write implies 200, and the
// headers are snapshotted at the first write. It holds the response until
// send, unless the body grows past limit: then it sends what it has and
// passes the rest through (streaming).
//
// The body is held after the head of the payload to store (its status and
// the stored headers, known once the first byte is written), so that the
// payload takes no copy.
type recorder struct {
	w         http.ResponseWriter
	limit     int
	stored    []string // the headers the payload keeps
	code      int
	snap      []headerValues // the header map at the first write
	buf       []byte         // the payload's head, then the body
	head      int            // the length of the head in buf
	streaming bool           // the body outgrew limit: writes pass through
	sent      bool           // status and headers are written to w
	snapArr   [8]headerValues
}

var errHijack = errors.New("idem: a connection cannot be hijacked under the idempotency middleware")

// Header returns the header map of the underlying writer, so that headers set
// by outer middleware are visible; changes after the first write are not
// part of the response.
func (rec *recorder) Header() http.Header { return rec.w.Header() }

// WriteHeader records the status of the first call; informational (1xx)
// statuses are dropped.
func (rec *recorder) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code)) // as net/http does
	}
	if rec.code != 0 || code < 200 {
		return
	}
	rec.code = code
	h := rec.w.Header()
	rec.snap = rec.snapArr[:0]
	if len(h) > len(rec.snapArr) {
		rec.snap = make([]headerValues, 0, len(h))
	}
	for k, v := range h {
		rec.snap = append(rec.snap, headerValues{k, v})
	}
}

// get returns the snapshot's values of key.
func (rec *recorder) get(key string) []string { return lookup(rec.snap, key) }

// Write holds p, implying status 200 on the first call.
func (rec *recorder) Write(p []byte) (int, error) {
	if rec.code == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(rec.code) {
		return 0, http.ErrBodyNotAllowed
	}
	if rec.streaming {
		return rec.w.Write(p)
	}
	if len(rec.buf)-rec.head+len(p) > rec.limit {
		rec.stream()
		return rec.w.Write(p)
	}
	rec.hold(len(p))
	rec.buf = append(rec.buf, p...)
	return len(p), nil
}

// hold makes room for the head and the first n bytes of a body, so that a
// small response takes one allocation.
func (rec *recorder) hold(n int) {
	if rec.buf == nil {
		size := headSize(payloadResponse, rec.snap, rec.stored)
		rec.buf = make([]byte, 0, size+min(rec.limit, max(n, firstBodyRead)))
		rec.buf = appendHead(rec.buf, payloadResponse, rec.code, rec.snap, rec.stored)
		rec.head = len(rec.buf)
	}
}

// body returns the body held so far.
func (rec *recorder) body() []byte { return rec.buf[rec.head:] }

// payload returns the payload to store: the held buffer, or, when no body
// was held or it outgrew the limit, a head of its own.
func (rec *recorder) payload() []byte {
	if rec.buf != nil {
		return rec.buf
	}
	tag := payloadResponse
	if rec.streaming {
		tag = payloadTooLarge
	}
	return appendHead(make([]byte, 0, headSize(tag, rec.snap, rec.stored)), tag, rec.code, rec.snap, rec.stored)
}

// WriteString is Write for a string.
func (rec *recorder) WriteString(s string) (int, error) {
	if rec.code == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if rec.streaming || len(rec.buf)-rec.head+len(s) > rec.limit || !bodyAllowed(rec.code) {
		return rec.Write([]byte(s))
	}
	rec.hold(len(s))
	rec.buf = append(rec.buf, s...)
	return len(s), nil
}

// FlushError commits the status like net/http's Flush, but sends nothing
// while the response is held.
func (rec *recorder) FlushError() error {
	if rec.code == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if !rec.streaming {
		return nil
	}
	return http.NewResponseController(rec.w).Flush()
}

// Flush implements http.Flusher; see FlushError.
func (rec *recorder) Flush() { _ = rec.FlushError() }

// Hijack refuses: a hijacked connection escapes the record.
func (rec *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) { return nil, nil, errHijack }

// Unwrap returns the underlying writer, for http.ResponseController.
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.w }

// finish settles the status of a handler that wrote nothing (200).
func (rec *recorder) finish() {
	if rec.code == 0 {
		rec.WriteHeader(http.StatusOK)
	}
}

// stream sends the status, headers and body held so far, and switches to
// passing writes through.
func (rec *recorder) stream() {
	rec.send()
	rec.streaming = true
	rec.buf, rec.head = nil, 0
}

// send writes the held response to the underlying writer, with the header
// map as it was at the first write. Trailers (declared in the Trailer
// header, or with http.TrailerPrefix) set by then are set again after the
// body, so that net/http sends them as trailers only, as it does without
// the middleware.
func (rec *recorder) send() {
	if rec.sent {
		return
	}
	rec.sent = true
	live := rec.w.Header()
	declared := rec.get("Trailer")
	var trailers []headerValues
	for k, v := range live {
		if isTrailer(k, declared) {
			trailers = append(trailers, headerValues{k, v})
			delete(live, k)
		} else if rec.get(k) == nil {
			delete(live, k)
		}
	}
	for _, kv := range rec.snap {
		live[kv.key] = kv.values
	}
	rec.w.WriteHeader(rec.code)
	if body := rec.body(); len(body) > 0 {
		_, _ = rec.w.Write(body)
	}
	for _, kv := range trailers {
		live[kv.key] = kv.values
	}
}

// isTrailer reports whether header key k is a trailer, which a handler sets
// after writing the body: declared in the Trailer header, or prefixed with
// http.TrailerPrefix.
func isTrailer(k string, declared []string) bool {
	if strings.HasPrefix(k, http.TrailerPrefix) {
		return true
	}
	for _, v := range declared {
		for f := range strings.SplitSeq(v, ",") {
			if http.CanonicalHeaderKey(strings.TrimSpace(f)) == k {
				return true
			}
		}
	}
	return false
}

// bodyAllowed reports whether a response with this status may have a body.
func bodyAllowed(code int) bool {
	return code >= 200 && code != http.StatusNoContent && code != http.StatusNotModified
}
