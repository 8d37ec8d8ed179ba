package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/gateway"
)

// logSink collects the proxy's log lines, safe for concurrent use.
type logSink struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{} // closed by the next write, if not nil
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
	return s.buf.Write(p)
}

// await returns the first log line whose fields include want, waiting for
// it at most 10 s: the proxy writes its lines after its answers.
func (s *logSink) await(t *testing.T, want map[string]any) map[string]any {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		s.mu.Lock()
		if s.changed == nil {
			s.changed = make(chan struct{})
		}
		changed := s.changed
		s.mu.Unlock()
		if l := s.find(want); l != nil {
			return l
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("no log line with %v: %s", want, s)
			return nil
		}
	}
}

// lines returns the JSON log lines so far.
func (s *logSink) lines() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(s.buf.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// find returns the first log line whose fields include want.
func (s *logSink) find(want map[string]any) map[string]any {
	for _, l := range s.lines() {
		match := true
		for k, v := range want {
			if l[k] != v {
				match = false
			}
		}
		if match {
			return l
		}
	}
	return nil
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// proxyRun is an idem proxy running in the test.
type proxyRun struct {
	url  string
	logs *logSink
	stop func() int // ends the run as SIGTERM does and returns its exit status
}

// startProxy runs idem proxy with args (-listen 127.0.0.1:0 added) and
// waits until it serves.
func startProxy(t *testing.T, args ...string) *proxyRun {
	t.Helper()
	return startCommand(t, append([]string{"proxy", "-listen", "127.0.0.1:0"}, args...)...)
}

// startCommand runs the command line args, a proxy, and waits until it
// serves.
func startCommand(t *testing.T, args ...string) *proxyRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &logSink{}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, args, io.Discard, logs)
	}()
	p := &proxyRun{logs: logs}
	var once sync.Once
	code := -1
	p.stop = func() int {
		once.Do(func() {
			cancel()
			select {
			case code = <-done:
			case <-time.After(30 * time.Second):
				t.Errorf("idem proxy did not stop")
			}
		})
		return code
	}
	t.Cleanup(func() { p.stop() })
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if l := logs.find(map[string]any{"event": "start"}); l != nil {
			p.url = "http://" + l["listen"].(string)
			return p
		}
		select {
		case code = <-done:
			t.Fatalf("idem proxy exited with %d: %s", code, logs)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("idem proxy did not start: %s", logs)
	return nil
}

// counting is an upstream that counts the requests it acts on, per
// Idempotency-Key, and records the attempt header of each.
type counting struct {
	srv  *httptest.Server
	runs atomic.Int32
	mu   sync.Mutex
	seen []seen
	// act answers a request; nil: 201 with the run's number.
	act func(w http.ResponseWriter, r *http.Request, run int32)
}

type seen struct {
	key, attempt, body string
	at                 time.Time
}

func newCounting(t *testing.T, act func(w http.ResponseWriter, r *http.Request, run int32)) *counting {
	u := &counting{act: act}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *counting) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	n := u.runs.Add(1)
	u.mu.Lock()
	u.seen = append(u.seen, seen{key: r.Header.Get("Idempotency-Key"), attempt: strings.Join(r.Header.Values(gateway.AttemptHeader), ","), body: string(body), at: time.Now()})
	u.mu.Unlock()
	if u.act != nil {
		u.act(w, r, n)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+itoa(n))
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"run":`+itoa(n)+`}`)
}

func itoa(n int32) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// requests returns what the upstream saw.
func (u *counting) requests() []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seen(nil), u.seen...)
}

// answer is a response, read whole.
type answer struct {
	status int
	header http.Header
	body   string
}

// send sends a request to the proxy; header is name, value pairs.
func send(t *testing.T, method, url, body string, header ...string) answer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r, err := http.NewRequest(method, url, rd)
	require.NoError(t, err)
	r.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(r)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// problemType returns the type of a problem answer.
func problemType(t *testing.T, a answer) string {
	t.Helper()
	require.Equal(t, "application/problem+json", a.header.Get("Content-Type"), a.body)
	var p struct{ Type string }
	require.NoError(t, json.Unmarshal([]byte(a.body), &p), a.body)
	return p.Type
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	l.Close()
	return addr
}
