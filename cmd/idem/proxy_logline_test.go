package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"
	"time"
)

// slogLine is the line slog's JSON handler writes for a request logged at
// t on level with attrs: what requestLine must write.
func slogLine(t *testing.T, at time.Time, level slog.Level, attrs ...slog.Attr) string {
	t.Helper()
	var buf bytes.Buffer
	r := slog.NewRecord(at, level, "request", 0)
	r.AddAttrs(attrs...)
	if err := slog.NewJSONHandler(&buf, nil).Handle(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// TestRequestLineAsSlog checks the request line against slog's JSON
// handler, field by field kind: strings, integers, durations, booleans, on
// both levels, with a time that has a zone and one without nanoseconds.
func TestRequestLineAsSlog(t *testing.T) {
	zone := time.FixedZone("x", 5*3600+30*60)
	for _, at := range []time.Time{
		time.Date(2026, 12, 7, 4, 22, 1, 123456789, time.UTC),
		time.Date(2026, 1, 2, 3, 4, 5, 0, zone),
	} {
		for _, level := range []slog.Level{slog.LevelInfo, slog.LevelWarn} {
			var buf bytes.Buffer
			l := newRequestLine(at, level)
			l.str("method", "POST")
			l.str("path", "/pay\"ments/\u00e9\n")
			l.int("status", 201)
			l.duration("duration", 1234567*time.Nanosecond)
			l.bool("aborted", true)
			l.int("fence", -3)
			l.bool("sent", false)
			l.str("outcome", "executed")
			l.writeTo(&buf)
			want := slogLine(t, at, level,
				slog.String("method", "POST"), slog.String("path", "/pay\"ments/\u00e9\n"),
				slog.Int("status", 201), slog.Duration("duration", 1234567*time.Nanosecond),
				slog.Bool("aborted", true), slog.Int64("fence", -3), slog.Bool("sent", false),
				slog.String("outcome", "executed"))
			if buf.String() != want {
				t.Errorf("got  %s\nwant %s", buf.String(), want)
			}
		}
	}
}

// FuzzRequestLineString checks the escaping of any string against slog's:
// control characters, quotes, invalid UTF-8, U+2028 and U+2029, HTML
// characters (not escaped by either).
func FuzzRequestLineString(f *testing.F) {
	for _, s := range []string{"", "plain", `"\`, "\x00\x01\x1f\x7f", "\t\r\n", "<a href='x'>&amp;</a>",
		"\xff\xfe", "a\xc3", "\u2028\u2029", "é日本🎉", "\xed\xa0\x80", "mixed\x00\"é\xff\u2028end"} {
		f.Add(s)
	}
	at := time.Date(2026, 12, 7, 4, 22, 1, 5, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		var buf bytes.Buffer
		l := newRequestLine(at, slog.LevelInfo)
		l.str("path", s)
		l.writeTo(&buf)
		if want := slogLine(t, at, slog.LevelInfo, slog.String("path", s)); buf.String() != want {
			t.Errorf("for %q\ngot  %s\nwant %s", s, buf.String(), want)
		}
	})
}

// BenchmarkRequestLine compares a replay's log line built directly with
// the same line logged through slog's JSON handler.
func BenchmarkRequestLine(b *testing.B) {
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			l := newRequestLine(time.Now(), slog.LevelInfo)
			l.str("method", "POST")
			l.str("path", "/payments")
			l.int("status", 201)
			l.duration("duration", 412*time.Microsecond)
			l.str("id", "buxl7XVhnulpDIfu_uR0vQ")
			l.int("fence", 1)
			l.str("outcome", "replayed")
			l.writeTo(io.Discard)
		}
	})
	b.Run("slog", func(b *testing.B) {
		b.ReportAllocs()
		log := slog.New(slog.NewJSONHandler(io.Discard, nil))
		ctx := context.Background()
		for b.Loop() {
			log.LogAttrs(ctx, slog.LevelInfo, "request",
				slog.String("method", "POST"), slog.String("path", "/payments"),
				slog.Int("status", 201), slog.Duration("duration", 412*time.Microsecond),
				slog.String("id", "buxl7XVhnulpDIfu_uR0vQ"), slog.Int64("fence", 1),
				slog.String("outcome", "replayed"))
		}
	})
}
