package main

import (
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// requestLine builds the log line of one request in the form
// slog.NewJSONHandler writes, the proxy's other lines' form: the same keys,
// values and escaping, built without a slog.Record, its attributes and the
// caller's program counter, which cost a proxied replay a few per cent of
// its time.
type requestLine struct{ b []byte }

var requestLines = sync.Pool{New: func() any { return &requestLine{b: make([]byte, 0, 512)} }}

// newRequestLine starts the line of a request logged at t, on level.
func newRequestLine(t time.Time, level slog.Level) *requestLine {
	l := requestLines.Get().(*requestLine)
	l.b = append(l.b[:0], `{"time":"`...)
	l.b = t.AppendFormat(l.b, time.RFC3339Nano)
	l.b = append(l.b, `","level":"`...)
	l.b = append(l.b, level.String()...)
	l.b = append(l.b, `","msg":"request"`...)
	return l
}

func (l *requestLine) key(k string) {
	l.b = append(l.b, ',', '"')
	l.b = appendJSONString(l.b, k)
	l.b = append(l.b, '"', ':')
}

func (l *requestLine) str(k, v string) {
	l.key(k)
	l.b = append(l.b, '"')
	l.b = appendJSONString(l.b, v)
	l.b = append(l.b, '"')
}

func (l *requestLine) int(k string, v int64) {
	l.key(k)
	l.b = strconv.AppendInt(l.b, v, 10)
}

// duration is written as slog's JSON handler writes one: nanoseconds.
func (l *requestLine) duration(k string, d time.Duration) { l.int(k, int64(d)) }

func (l *requestLine) bool(k string, v bool) {
	l.key(k)
	l.b = strconv.AppendBool(l.b, v)
}

// writeTo ends the line, writes it to w in one Write and returns l to the
// pool.
func (l *requestLine) writeTo(w io.Writer) {
	l.b = append(l.b, '}', '\n')
	_, _ = w.Write(l.b) // a log line that cannot be written is lost, as with slog
	if cap(l.b) <= 4<<10 {
		requestLines.Put(l)
	}
}

// appendJSONString appends s escaped as encoding/json and log/slog escape a
// string (without HTML escaping): quotes, backslashes and control
// characters escaped, invalid UTF-8 as U+FFFD, U+2028 and U+2029 as \u
// sequences.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	return append(b, s[start:]...)
}
