package idem

import (
	"bytes"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"
)

// eofReader returns its data with io.EOF on the last read, as io.Readers may.
type eofReader struct{ data []byte }

func (r *eofReader) Read(p []byte) (int, error) {
	n := copy(p, r.data)
	r.data = r.data[n:]
	if len(r.data) == 0 {
		return n, io.EOF
	}
	return n, nil
}

func TestReadBody(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   io.Reader
		length int64
		max    int64
		want   string
		status int
	}{
		{name: "announced", body: strings.NewReader("hello"), length: 5, max: 10, want: "hello"},
		{name: "announced, EOF with the data", body: &eofReader{[]byte("hello")}, length: 5, max: 10, want: "hello"},
		{name: "announced, shorter", body: &eofReader{[]byte("hel")}, length: 5, max: 10, status: 400},
		{name: "announced, larger than the limit", body: strings.NewReader("hello"), length: 5, max: 4, status: 413},
		{name: "announced empty", body: strings.NewReader(""), length: 0, max: 4, want: ""},
		{name: "unknown length", body: strings.NewReader(strings.Repeat("x", 3000)), length: -1, max: 5000, want: strings.Repeat("x", 3000)},
		{name: "unknown length, EOF with the data", body: &eofReader{[]byte("hello")}, length: -1, max: 10, want: "hello"},
		{name: "unknown length, at the limit", body: strings.NewReader("hello"), length: -1, max: 5, want: "hello"},
		{name: "unknown length, the largest limit", body: strings.NewReader("hello"), length: -1, max: math.MaxInt64, want: "hello"},
		{name: "unknown length, past the limit", body: strings.NewReader("hello!"), length: -1, max: 5, status: 413},
		{name: "unknown length, broken", body: io.MultiReader(strings.NewReader("he"), iotest.ErrReader(io.ErrUnexpectedEOF)), length: -1, max: 5, status: 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			r.Body, r.ContentLength = io.NopCloser(tc.body), tc.length
			buf, status := readBody(r, tc.max, nil)
			require.Equal(t, tc.status, status)
			if status == 0 {
				require.Equal(t, tc.want, string(buf))
				require.LessOrEqual(t, cap(buf), max(2*len(tc.want), firstBodyRead), "grown with the bytes read")
			}
		})
	}
}

// TestReadBodyReusedBuffer: a reused buffer, larger than the body and
// holding an earlier body, reads no more than a fresh one.
func TestReadBodyReusedBuffer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   string
		length int64
		max    int64
		want   string
		status int
	}{
		{name: "announced", body: "hello", length: 5, max: 10, want: "hello"},
		{name: "more bytes than announced", body: "hello", length: 2, max: 10, want: "he"},
		{name: "unknown length", body: "hello", length: -1, max: 10, want: "hello"},
		{name: "unknown length, past the limit", body: "hello!", length: -1, max: 5, status: 413},
		{name: "larger than the buffer", body: strings.Repeat("y", 5000), length: 5000, max: 8000, want: strings.Repeat("y", 5000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := bytes.Repeat([]byte("x"), 4096)
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			r.Body, r.ContentLength = io.NopCloser(strings.NewReader(tc.body)), tc.length
			buf, status := readBody(r, tc.max, old[:0])
			require.Equal(t, tc.status, status)
			if status == 0 {
				require.Equal(t, tc.want, string(buf))
			}
		})
	}
}

// FuzzReadBody: whatever length a client announces and whatever it sends,
// readBody never panics, keeps to the limit, and allocates in proportion to
// the bytes that arrived.
func FuzzReadBody(f *testing.F) {
	f.Add([]byte("hello"), int64(5), int64(10), false)
	f.Add([]byte("he"), int64(1<<20), int64(1<<20), true) // announced a megabyte, sent two bytes
	f.Add([]byte("hello"), int64(-1), int64(4), false)    // no length, past the limit
	f.Add([]byte(""), int64(0), int64(1), false)          // empty
	f.Add([]byte("abc"), int64(2), int64(10), false)      // more bytes than announced
	f.Add([]byte("x"), int64(1<<62), int64(1<<62), true)  // an absurd length
	f.Fuzz(func(t *testing.T, body []byte, announced, limit int64, withEOF bool) {
		if limit <= 0 {
			return
		}
		var rd io.Reader = bytes.NewReader(body)
		if withEOF {
			rd = &eofReader{append([]byte(nil), body...)}
		}
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Body, r.ContentLength = io.NopCloser(rd), max(announced, -1)
		got, status := readBody(r, limit, nil)
		if status != 0 {
			return
		}
		require.LessOrEqual(t, int64(len(got)), limit)
		require.Equal(t, string(body[:len(got)]), string(got))
		if r.ContentLength < 0 {
			require.Equal(t, len(body), len(got))
		} else {
			require.EqualValues(t, r.ContentLength, len(got))
		}
		require.LessOrEqual(t, cap(got), max(2*len(got), firstBodyRead))
	})
}

// TestBodyReader: the body handed to the handler reads whole, once, by Read
// or WriteTo or both, and tells the middleware when every byte is read.
func TestBodyReader(t *testing.T) {
	b := &bodyReader{b: []byte("hello, world")}
	p := make([]byte, 5)
	n, err := b.Read(p)
	if n != 5 || err != nil || string(p) != "hello" || b.drained() {
		t.Fatalf("Read: %d %v %q drained=%v", n, err, p[:n], b.drained())
	}
	var rest bytes.Buffer
	m, err := b.WriteTo(&rest)
	if m != 7 || err != nil || rest.String() != ", world" || !b.drained() {
		t.Fatalf("WriteTo: %d %v %q drained=%v", m, err, rest.String(), b.drained())
	}
	for range 2 { // and nothing more, however asked
		if n, err := b.Read(p); n != 0 || err != io.EOF {
			t.Fatalf("Read at the end: %d %v", n, err)
		}
		if m, err := b.WriteTo(&rest); m != 0 || err != nil || rest.Len() != 7 {
			t.Fatalf("WriteTo at the end: %d %v", m, err)
		}
	}

	b = &bodyReader{b: []byte("hello")}
	if n, err := b.Read(make([]byte, 5)); n != 5 || err != nil || !b.drained() {
		t.Fatalf("Read of the whole body: %d %v drained=%v", n, err, b.drained())
	}
}
