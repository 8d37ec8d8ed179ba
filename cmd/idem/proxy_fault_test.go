package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/gateway"
	"github.com/idemkit/idem/internal/redistest"
)

// hangUp drops the client's connection without an answer.
func hangUp(w http.ResponseWriter) {
	if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
		c.Close()
	}
}

// TestProxyDroppedAfterActing: the upstream acts, then drops the
// connection. The client gets 502; no retry reaches the upstream before the
// lease runs out; then the retry is attempt 2, with Idempotency-Attempt: 2,
// and its answer is replayed after.
func TestProxyDroppedAfterActing(t *testing.T) {
	const lease = 2 * time.Second
	u := newCounting(t, func(w http.ResponseWriter, r *http.Request, run int32) {
		if run == 1 {
			hangUp(w)
			return
		}
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("reconciled"))
	})
	p := startProxy(t, proxyArgs(t, u.srv.URL, "-lease", lease.String())...)
	post := func() answer {
		return send(t, http.MethodPost, p.url+"/charges", `{"amount":100}`, "Idempotency-Key", "charge-1")
	}
	a := post()
	require.Equal(t, http.StatusBadGateway, a.status)
	require.Equal(t, gateway.ProblemFailed, problemType(t, a))
	first := u.requests()[0].at

	// Retries until the lease runs out: 409, the upstream not called.
	var got answer
	deadline := time.Now().Add(lease + 5*time.Second)
	for time.Now().Before(deadline) {
		got = post()
		if got.status != http.StatusConflict {
			break
		}
		require.NotEmpty(t, got.header.Get("Retry-After"))
		require.EqualValues(t, 1, u.runs.Load(), "no second execution while the first attempt's lease lasts")
		time.Sleep(50 * time.Millisecond)
	}
	require.Equal(t, http.StatusCreated, got.status, got.body)
	require.Equal(t, "reconciled", got.body)
	seen := u.requests()
	require.Len(t, seen, 2)
	require.Equal(t, "1", seen[0].attempt)
	require.Equal(t, "2", seen[1].attempt, "the retry after the lease is attempt 2")
	require.GreaterOrEqual(t, seen[1].at.Sub(first), lease-100*time.Millisecond, "not before the lease ran out")

	r := post()
	require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	require.Equal(t, "reconciled", r.body)
	require.EqualValues(t, 2, u.runs.Load())
	p.logs.await(t, map[string]any{"msg": "request", "outcome": "abandoned", "key": "abandoned", "sent": true})
}

// TestProxyDroppedReusedConnection: an upstream that drops a kept-alive
// connection after acting on a request without a body acts once: the
// transport does not send the request again.
func TestProxyDroppedReusedConnection(t *testing.T) {
	u := newCounting(t, func(w http.ResponseWriter, r *http.Request, run int32) {
		if r.Header.Get("Idempotency-Key") == "k2" {
			hangUp(w)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	p := startProxy(t, proxyArgs(t, u.srv.URL, "-lease", "1m")...)
	require.Equal(t, http.StatusNoContent, send(t, http.MethodPost, p.url+"/ping", "", "Idempotency-Key", "k1").status)
	a := send(t, http.MethodPost, p.url+"/ping", "", "Idempotency-Key", "k2")
	require.Equal(t, http.StatusBadGateway, a.status)
	require.EqualValues(t, 2, u.runs.Load(), "k2 reached the upstream once")
}

// TestProxyUpstreamRefused: an upstream that refuses connections gets 502
// upstream-unreachable, never stored (even with -store-5xx); the key is
// released, so a retry once the upstream is back runs at once, and as
// attempt 1: the attempt that never reached the upstream does not count.
func TestProxyUpstreamRefused(t *testing.T) {
	addr := closedAddr(t)
	p := startProxy(t, proxyArgs(t, "http://"+addr, "-store-5xx", "-lease", "1m")...)
	post := func() answer {
		return send(t, http.MethodPost, p.url+"/charges", `{"amount":100}`, "Idempotency-Key", "charge-1")
	}
	a := post()
	require.Equal(t, http.StatusBadGateway, a.status)
	require.Equal(t, gateway.ProblemUnreachable, problemType(t, a))
	p.logs.await(t, map[string]any{"msg": "request", "outcome": "released", "key": "released", "sent": false})

	// The upstream comes back on its address.
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	u := newCounting(t, nil)
	u.srv.Close()
	back := httptest.NewUnstartedServer(http.HandlerFunc(u.serve))
	back.Listener = ln
	back.Start()
	defer back.Close()

	b := post()
	require.Equal(t, http.StatusCreated, b.status, "the released key runs at once")
	require.Empty(t, b.header.Get("Idempotent-Replayed"))
	n, err := strconv.Atoi(u.requests()[0].attempt)
	require.NoError(t, err)
	require.Equal(t, 1, n, "an attempt never sent is not counted: the retry is attempt 1 again")
	require.Equal(t, "true", post().header.Get("Idempotent-Replayed"))
	require.EqualValues(t, 1, u.runs.Load())
}

// TestProxyUpstreamTimeout: an upstream whose response does not come within
// -upstream-timeout gets 504; the key stays in progress.
func TestProxyUpstreamTimeout(t *testing.T) {
	release := make(chan struct{})
	u := newCounting(t, func(w http.ResponseWriter, r *http.Request, run int32) { <-release })
	defer close(release)
	p := startProxy(t, proxyArgs(t, u.srv.URL, "-upstream-timeout", "300ms", "-lease", "1m")...)
	a := send(t, http.MethodPost, p.url+"/charges", `{}`, "Idempotency-Key", "slow-1")
	require.Equal(t, http.StatusGatewayTimeout, a.status)
	require.Equal(t, gateway.ProblemTimeout, problemType(t, a))
	require.Equal(t, http.StatusConflict, send(t, http.MethodPost, p.url+"/charges", `{}`, "Idempotency-Key", "slow-1").status)
	require.EqualValues(t, 1, u.runs.Load())
}

// TestProxyRedisFrozen: with Redis frozen, a keyed request gets 503 and
// the upstream is not called; /readyz says not ready; unkeyed requests
// still pass.
func TestProxyRedisFrozen(t *testing.T) {
	srv := redistest.Start(t)
	u := newCounting(t, nil)
	admin := closedAddr(t)
	p := startProxy(t, "-upstream", u.srv.URL, "-redis", "redis://"+srv.Addr()+"?read_timeout=500ms&write_timeout=500ms", "-admin", admin)
	ready := func() int {
		resp, err := http.Get("http://" + admin + "/readyz")
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, ready())
	resp, err := http.Get("http://" + admin + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	srv.Pause(t)
	defer srv.Resume(t)
	start := time.Now()
	a := send(t, http.MethodPost, p.url+"/charges", `{}`, "Idempotency-Key", "frozen-1")
	require.Equal(t, http.StatusServiceUnavailable, a.status, a.body)
	require.Contains(t, problemType(t, a), "#store-unavailable")
	require.NotEmpty(t, a.header.Get("Retry-After"))
	require.Less(t, time.Since(start), 10*time.Second)
	require.EqualValues(t, 0, u.runs.Load(), "the upstream is not called")
	require.Equal(t, http.StatusServiceUnavailable, ready())
	require.Equal(t, http.StatusCreated, send(t, http.MethodPost, p.url+"/charges", `{}`).status, "unkeyed requests pass")
}

// TestProxyStoreTimeout: with Redis frozen and a URL that leaves go-redis
// its defaults (a 3 s read timeout, retried: 10 s or more to an error),
// -store-timeout bounds the wait of a keyed request, which gets 503
// without reaching the upstream. The bound, 2 s, is ten times the budget
// and below go-redis's first read timeout.
func TestProxyStoreTimeout(t *testing.T) {
	srv := redistest.Start(t)
	u := newCounting(t, nil)
	p := startProxy(t, "-upstream", u.srv.URL, "-redis", "redis://"+srv.Addr(), "-store-timeout", "200ms")
	require.Equal(t, http.StatusCreated, send(t, http.MethodPost, p.url+"/charges", `{}`, "Idempotency-Key", "warm-1").status)
	srv.Pause(t)
	defer srv.Resume(t)
	start := time.Now()
	a := send(t, http.MethodPost, p.url+"/charges", `{}`, "Idempotency-Key", "budget-1")
	took := time.Since(start)
	require.Equal(t, http.StatusServiceUnavailable, a.status, a.body)
	require.Contains(t, problemType(t, a), "#store-unavailable")
	require.Less(t, took, 2*time.Second, "bounded by -store-timeout, not by go-redis's timeouts")
	require.EqualValues(t, 1, u.runs.Load(), "the upstream is not called")
}

// TestProxyShutdown: on SIGTERM, a request in flight finishes and is
// stored; then the proxy exits 0, and the next proxy replays the response.
func TestProxyShutdown(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	u := newCounting(t, func(w http.ResponseWriter, r *http.Request, run int32) {
		if run == 1 {
			close(started)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	})
	args := proxyArgs(t, u.srv.URL, "-shutdown-timeout", "10s")
	p := startProxy(t, args...)
	done := make(chan answer, 1)
	go func() { done <- send(t, http.MethodPost, p.url+"/charges", `{}`, "Idempotency-Key", "inflight-1") }()
	<-started
	stopped := make(chan int, 1)
	go func() { stopped <- p.stop() }()
	require.Eventually(t, func() bool { return p.logs.find(map[string]any{"event": "shutdown"}) != nil }, 5*time.Second, 5*time.Millisecond)
	close(release)
	require.Equal(t, http.StatusCreated, (<-done).status, "the request in flight finishes")
	require.Equal(t, exitOK, <-stopped)
	p.logs.await(t, map[string]any{"msg": "request", "outcome": "executed"})

	next := startProxy(t, args...)
	a := send(t, http.MethodPost, next.url+"/charges", `{}`, "Idempotency-Key", "inflight-1")
	require.Equal(t, "true", a.header.Get("Idempotent-Replayed"), "the response was recorded before the proxy stopped")
	require.Equal(t, "charged", a.body)
	require.EqualValues(t, 1, u.runs.Load())
}

// TestProxyBodyBrokenOff: an upstream that acts, answers, then breaks off
// in the middle of its body: the client's response is aborted, and the key
// stays in progress (the upstream acted; its answer is lost).
func TestProxyBodyBrokenOff(t *testing.T) {
	u := newCounting(t, func(w http.ResponseWriter, r *http.Request, run int32) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("partial"))
		http.NewResponseController(w).Flush()
		hangUp(w)
	})
	p := startProxy(t, proxyArgs(t, u.srv.URL, "-lease", "1m")...)
	r, err := http.NewRequest(http.MethodPost, p.url+"/charges", strings.NewReader(`{}`))
	require.NoError(t, err)
	r.Header.Set("Idempotency-Key", "broken-1")
	r.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(r)
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	require.Error(t, err, "the client's response is aborted")
	a := send(t, http.MethodPost, p.url+"/charges", `{}`, "Idempotency-Key", "broken-1")
	require.Equal(t, http.StatusConflict, a.status, "the key stays in progress")
	require.EqualValues(t, 1, u.runs.Load())
	require.Eventually(t, func() bool {
		return p.logs.find(map[string]any{"msg": "request", "outcome": "abandoned", "aborted": true}) != nil
	}, 5*time.Second, 10*time.Millisecond, p.logs.String())
}

// TestProxySIGTERM: the command, run as a process, stops on SIGTERM after
// the request in flight finished, and exits 0.
func TestProxySIGTERM(t *testing.T) {
	bin, err := os.Executable()
	require.NoError(t, err)
	started, release := make(chan struct{}), make(chan struct{})
	u := newCounting(t, func(w http.ResponseWriter, r *http.Request, run int32) {
		close(started)
		<-release
		w.WriteHeader(http.StatusCreated)
	})
	listen := closedAddr(t)
	cmd := exec.Command(bin, proxyArgs(t, u.srv.URL, "-listen", listen)...)
	cmd.Args = append([]string{bin, "proxy"}, cmd.Args[1:]...)
	cmd.Env = append(os.Environ(), asCommandEnv+"=1")
	logs := &logSink{}
	cmd.Stderr = logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer cmd.Process.Kill()
	require.Eventually(t, func() bool { return logs.find(map[string]any{"event": "start"}) != nil }, 15*time.Second, 10*time.Millisecond, "%s", logs)

	done := make(chan answer, 1)
	go func() {
		done <- send(t, http.MethodPost, "http://"+listen+"/charges", `{}`, "Idempotency-Key", "term-1")
	}()
	<-started
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool { return logs.find(map[string]any{"event": "shutdown"}) != nil }, 5*time.Second, 5*time.Millisecond, "%s", logs)
	close(release)
	require.Equal(t, http.StatusCreated, (<-done).status)
	select {
	case err := <-exited:
		require.NoError(t, err, "exit status 0: %s", logs)
	case <-time.After(15 * time.Second):
		t.Fatalf("idem proxy did not exit: %s", logs)
	}
}
