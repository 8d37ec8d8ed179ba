package idem

import (
	"encoding/binary"
	"errors"
	"slices"
)

// headerValues is one entry of a header snapshot. Keeping the value slices is
// enough: Set, Add and Del replace slices, they do not change them.
type headerValues struct {
	key    string
	values []string
}

// lookup returns the values of key in snap.
func lookup(snap []headerValues, key string) []string {
	for _, kv := range snap {
		if kv.key == key {
			return kv.values
		}
	}
	return nil
}

// A stored response is a compact binary payload:
//
//	tag     1 byte: payloadResponse, or payloadTooLarge (no body stored)
//	status and count (of header values), in one of two forms:
//	        compact: one byte c ≥ compactCode, for a status in
//	                 wellKnownStatuses and at most compactCount values:
//	                 status wellKnownStatuses[(c-compactCode)/4], count (c-compactCode)%4
//	        long:    the status in 2 bytes, big endian (the first is below
//	                 compactCode: a status is below 1024), then the count, uvarint
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

// wellKnownStatuses are the statuses of the compact form: those a response
// that is stored commonly has. Append only, at most 63.
var wellKnownStatuses = [...]uint16{
	200, 201, 202, 203, 204, 205, 206, 207, 208, 226,
	300, 301, 302, 303, 304, 305, 307, 308,
	400, 401, 402, 403, 404, 405, 406, 407, 408, 409, 410, 411, 412, 413, 414, 415, 416, 417, 418,
	421, 422, 423, 424, 425, 426, 428, 429, 431, 451,
	500, 501, 502, 503, 504,
}

const (
	compactCode  = 4 // first byte of the compact form
	compactCount = 3 // the most header values of the compact form
)

// appendStatus appends a payload's status and count of header values, in
// the compact form when it has one.
func appendStatus(b []byte, status, count int) []byte {
	if i := slices.Index(wellKnownStatuses[:], uint16(status)); i >= 0 && count <= compactCount {
		return append(b, byte(compactCode+4*i+count))
	}
	b = append(b, byte(status>>8), byte(status))
	return binary.AppendUvarint(b, uint64(count))
}

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
	b = appendStatus(append(b, tag), status, count)
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

// responseHead is what a payload's head says. Its headers, checked, are read
// one by one with nextHeader from first; the body starts at end.
type responseHead struct {
	tooLarge bool
	status   int
	count    int  // header values
	first    int  // where the headers start
	end      int  // where they end
	texts    bool // a name or a value is stored as text, not as a code
}

// parseHead parses and checks the head of a payload made by appendHead.
func parseHead(p []byte) (responseHead, error) {
	var r responseHead
	if len(p) < 2 || (p[0] != payloadResponse && p[0] != payloadTooLarge) {
		return r, errPayload
	}
	r.tooLarge = p[0] == payloadTooLarge
	count := uint64(0)
	if c := int(p[1]); c >= compactCode {
		i := (c - compactCode) / 4
		if i >= len(wellKnownStatuses) {
			return r, errPayload
		}
		r.status, count, r.first = int(wellKnownStatuses[i]), uint64((c-compactCode)%4), 2
	} else {
		if len(p) < 4 {
			return r, errPayload
		}
		r.status = c<<8 | int(p[2])
		if r.status < 100 || r.status > 999 {
			return r, errPayload
		}
		var n int
		if count, n = binary.Uvarint(p[3:]); n <= 0 || count > uint64(len(p)) {
			return r, errPayload
		}
		r.first = 3 + n
	}
	r.count = int(count)
	var ok bool
	if r.end, r.texts, ok = headersEnd(p, r.first, count); !ok {
		return r, errPayload
	}
	return r, nil
}

// text returns the string that nextHeader cuts the texts of p's headers
// from: one string for all of them, or "" when there are none.
func (r *responseHead) text(p []byte) string {
	if !r.texts {
		return ""
	}
	return string(p[:r.end])
}

// nextHeader returns the header at p[i:], checked by parseHead, with its
// texts cut from s (responseHead.text), and the index after it.
func nextHeader(p []byte, s string, i int) (name, value string, next int) {
	code := p[i]
	i++
	switch {
	case code >= typeCode:
		return "Content-Type", wellKnownTypes[code-typeCode], i
	case code == 0:
		name, i, _ = cut(p, s, i)
	default:
		name = wellKnownHeaders[code-1]
	}
	value, i, _ = cut(p, s, i)
	return name, value, i
}

// decodeResponse parses a payload made by appendHead and the body. The
// header values share one string.
func decodeResponse(p []byte) (storedResponse, error) {
	h, err := parseHead(p)
	if err != nil {
		return storedResponse{}, err
	}
	r := storedResponse{tooLarge: h.tooLarge, status: h.status, headers: make([]storedHeader, h.count), body: p[h.end:]}
	s, i := h.text(p), h.first
	for k := range r.headers {
		r.headers[k].name, r.headers[k].value, i = nextHeader(p, s, i)
	}
	return r, nil
}

// headersEnd checks the count headers of p that start at i, and returns
// where they end and whether any is stored as text.
func headersEnd(p []byte, i int, count uint64) (end int, texts bool, ok bool) {
	for range count {
		if i >= len(p) {
			return 0, false, false
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
			return 0, false, false
		}
		if ok {
			_, i, ok = cut(p, "", i)
		}
		if !ok {
			return 0, false, false
		}
		texts = true
	}
	return i, texts, true
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
