package idem

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
)

// recorder captures a handler's response the way httptest.ResponseRecorder
// does: the first WriteHeader wins, the first Write implies 200, and the
// headers are snapshotted at the first write. It holds the response until
// send, unless the body grows past limit: then it sends what it has and
// passes the rest through (streaming).
type recorder struct {
	w         http.ResponseWriter
	limit     int
	code      int
	snap      []headerValues // the header map at the first write
	body      []byte
	streaming bool // the body outgrew limit: writes pass through
	sent      bool // status and headers are written to w
}

// headerValues is one entry of a header snapshot. Keeping the value slices is
// enough: Set, Add and Del replace slices, they do not change them.
type headerValues struct {
	key    string
	values []string
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
	rec.snap = make([]headerValues, 0, len(h))
	for k, v := range h {
		rec.snap = append(rec.snap, headerValues{k, v})
	}
}

// get returns the snapshot's values of key.
func (rec *recorder) get(key string) []string { return lookup(rec.snap, key) }

func lookup(snap []headerValues, key string) []string {
	for _, kv := range snap {
		if kv.key == key {
			return kv.values
		}
	}
	return nil
}

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
	if len(rec.body)+len(p) > rec.limit {
		rec.stream()
		return rec.w.Write(p)
	}
	rec.hold(len(p))
	rec.body = append(rec.body, p...)
	return len(p), nil
}

// hold makes room for the first n bytes of a body, so that a small body
// takes one allocation.
func (rec *recorder) hold(n int) {
	if rec.body == nil {
		rec.body = make([]byte, 0, min(rec.limit, max(n, firstBodyRead)))
	}
}

// WriteString is Write for a string.
func (rec *recorder) WriteString(s string) (int, error) {
	if rec.code == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if rec.streaming || len(rec.body)+len(s) > rec.limit || !bodyAllowed(rec.code) {
		return rec.Write([]byte(s))
	}
	rec.hold(len(s))
	rec.body = append(rec.body, s...)
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
	rec.body = nil
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
	if len(rec.body) > 0 {
		_, _ = rec.w.Write(rec.body)
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

// A stored response is a compact binary payload:
//
//	tag     1 byte: payloadResponse, or payloadTooLarge (no body stored)
//	status  2 bytes, big endian
//	count   uvarint: number of header values
//	count × header: a code byte, then
//	        0:            uvarint length and the name, uvarint length and the value
//	        1 to 0x3f:    the name wellKnownHeaders[code-1], uvarint length and the value
//	        0x40 to 0x7f: Content-Type with the value wellKnownTypes[code-0x40]
//	body    the remaining bytes
const (
	payloadResponse byte = 'r'
	payloadTooLarge byte = 't'
)

// wellKnownHeaders are stored as one byte. Append only: stored records refer
// to the positions. A name added here is unreadable to a replica still
// running an older version (its replay of such a record fails), so the
// headers stored since (Content-Encoding and the others that describe the
// body) are stored by name: rarer, and readable by every version.
var wellKnownHeaders = [...]string{"Content-Type", "Location", "Content-Location", "Etag", "Last-Modified"}

// wellKnownTypes are Content-Type values stored as one byte. Append only.
var wellKnownTypes = [...]string{
	"application/json", "application/json; charset=utf-8", "application/problem+json",
	"text/plain; charset=utf-8", "text/html; charset=utf-8", "application/octet-stream",
}

const typeCode = 0x40 // first Content-Type value code

// describesBody reports whether a header describes the body, which is not
// kept for a response too large to store.
func describesBody(name string) bool {
	switch name {
	case "Content-Type", "Content-Location", "Etag", "Last-Modified", "Content-Encoding", "Content-Language",
		"Content-Disposition", "Content-Range", "Vary", "Cache-Control":
		return true
	}
	return false
}

func wellKnown(name string) byte {
	for i, n := range wellKnownHeaders {
		if n == name {
			return byte(i + 1)
		}
	}
	return 0
}

// headSize bounds the encoded size of a payload's head.
func headSize(tag byte, snap []headerValues, names []string) int {
	size := 3 + binary.MaxVarintLen32
	for _, n := range names {
		if tag == payloadTooLarge && describesBody(n) {
			continue
		}
		for _, v := range lookup(snap, n) {
			size += 1 + binary.MaxVarintLen32 + len(v)
			if wellKnown(n) == 0 {
				size += binary.MaxVarintLen32 + len(n)
			}
		}
	}
	return size
}

// appendHead appends a payload's head: the tag, the status and the values
// of the headers named in names (for payloadTooLarge, those that do not
// describe the body).
func appendHead(b []byte, tag byte, status int, snap []headerValues, names []string) []byte {
	count := 0
	for _, n := range names {
		if tag != payloadTooLarge || !describesBody(n) {
			count += len(lookup(snap, n))
		}
	}
	b = append(b, tag, byte(status>>8), byte(status))
	b = binary.AppendUvarint(b, uint64(count))
	for _, n := range names {
		if tag == payloadTooLarge && describesBody(n) {
			continue
		}
		code := wellKnown(n)
		for _, v := range lookup(snap, n) {
			if n == "Content-Type" {
				if i := slices.Index(wellKnownTypes[:], v); i >= 0 {
					b = append(b, typeCode+byte(i))
					continue
				}
			}
			b = append(b, code)
			if code == 0 {
				b = binary.AppendUvarint(b, uint64(len(n)))
				b = append(b, n...)
			}
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return b
}

type storedResponse struct {
	tooLarge bool
	status   int
	headers  []storedHeader // grouped by name, as stored
	body     []byte
}

type storedHeader struct{ name, value string }

var errPayload = errors.New("idem: malformed stored response")

// decodeResponse parses a payload made by appendHead and the body. The
// header values share one string.
func decodeResponse(p []byte) (storedResponse, error) {
	var r storedResponse
	if len(p) < 4 || (p[0] != payloadResponse && p[0] != payloadTooLarge) {
		return r, errPayload
	}
	r.tooLarge = p[0] == payloadTooLarge
	r.status = int(p[1])<<8 | int(p[2])
	if r.status < 100 || r.status > 999 {
		return r, errPayload
	}
	count, n := binary.Uvarint(p[3:])
	if n <= 0 || count > uint64(len(p)) {
		return r, errPayload
	}
	// First pass: find where the headers end; second: cut them out of
	// one string.
	i := 3 + n
	end, ok := headersEnd(p, i, count)
	if !ok {
		return r, errPayload
	}
	head := string(p[:end])
	r.headers = make([]storedHeader, count)
	for k := range r.headers {
		h := &r.headers[k]
		code := p[i]
		i++
		switch {
		case code >= typeCode:
			h.name, h.value = "Content-Type", wellKnownTypes[code-typeCode]
			continue
		case code == 0:
			h.name, i, _ = cut(p, head, i)
		default:
			h.name = wellKnownHeaders[code-1]
		}
		h.value, i, _ = cut(p, head, i)
	}
	r.body = p[end:]
	return r, nil
}

// headersEnd checks the count headers of p that start at i, and returns
// where they end.
func headersEnd(p []byte, i int, count uint64) (int, bool) {
	for range count {
		if i >= len(p) {
			return 0, false
		}
		code := p[i]
		i++
		ok := true
		switch {
		case code >= typeCode && int(code-typeCode) < len(wellKnownTypes):
			continue
		case code == 0:
			_, i, ok = cut(p, "", i)
		case int(code) > len(wellKnownHeaders):
			return 0, false
		}
		if ok {
			_, i, ok = cut(p, "", i)
		}
		if !ok {
			return 0, false
		}
	}
	return i, true
}

// cut reads the length-prefixed string at p[i:], returned as a substring of
// s (the string of p's head, or "" to only check it), and the index after it.
func cut(p []byte, s string, i int) (string, int, bool) {
	l, n := binary.Uvarint(p[i:])
	if n <= 0 || l > uint64(len(p)-i-n) {
		return "", 0, false
	}
	i += n
	return s[min(i, len(s)):min(i+int(l), len(s))], i + int(l), true
}
