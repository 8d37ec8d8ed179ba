package main

import (
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/redistest"
)

// stalled is an upstream address that accepts connections and never
// answers, not even a TLS handshake: an https:// request to it is never
// sent. It reports each connection it accepts.
func stalled(t *testing.T) (addr string, accepted <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ch := make(chan struct{}, 16)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			ch <- struct{}{}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String(), ch
}

// postAsync sends a keyed POST to url and reports its status, or 0 when
// the connection broke.
func postAsync(url, key string) <-chan int {
	done := make(chan int, 1)
	go func() {
		r, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", key)
		r.Header.Set("Content-Type", "application/json") // as send does: the same request
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	return done
}

// TestProxyShutdownReleasesUnsent: a request still connecting to the
// upstream when the grace period ends was never sent: the proxy releases
// its key before it exits, and a retry on the next proxy runs at once.
func TestProxyShutdownReleasesUnsent(t *testing.T) {
	addr, accepted := stalled(t)
	prefix := redistest.Prefix(t)
	url := "redis://" + redistest.Shared(t).Addr()
	p := startProxy(t, "-upstream", "https://"+addr, "-redis", url, "-prefix", prefix, "-lease", "1h", "-shutdown-timeout", "100ms")
	done := postAsync(p.url+"/charges", "unsent-1")
	<-accepted // the proxy is in the TLS handshake: nothing sent
	require.Equal(t, exitOK, p.stop())
	<-done
	p.logs.await(t, map[string]any{"event": "shutdown_cut"})
	p.logs.await(t, map[string]any{"msg": "request", "key": "released", "sent": false})

	u := newCounting(t, nil)
	next := startProxy(t, "-upstream", u.srv.URL, "-redis", url, "-prefix", prefix, "-lease", "1h")
	a := send(t, http.MethodPost, next.url+"/charges", `{}`, "Idempotency-Key", "unsent-1")
	require.Equal(t, http.StatusCreated, a.status, "the key was released: the retry runs at once, %s", a.body)
	require.EqualValues(t, 1, u.runs.Load())
}

// TestProxyShutdownKeepsSent: a request the upstream received and has not
// answered when the grace period ends may have acted: its key stays in
// progress until its lease runs out (a retry meanwhile gets 409).
func TestProxyShutdownKeepsSent(t *testing.T) {
	received, hold := make(chan struct{}), make(chan struct{})
	u := newCounting(t, func(w http.ResponseWriter, r *http.Request, run int32) {
		close(received)
		<-hold
	})
	t.Cleanup(func() { close(hold) }) // before the upstream's Close, which waits for it
	args := proxyArgs(t, u.srv.URL, "-lease", "1h", "-shutdown-timeout", "100ms")
	p := startProxy(t, args...)
	done := postAsync(p.url+"/charges", "sent-1")
	<-received
	start := time.Now()
	require.Equal(t, exitOK, p.stop())
	<-done
	require.Less(t, time.Since(start), settleTimeout, "the request cut off settled in time")
	p.logs.await(t, map[string]any{"msg": "request", "key": "abandoned", "sent": true})

	next := startProxy(t, args...)
	a := send(t, http.MethodPost, next.url+"/charges", `{}`, "Idempotency-Key", "sent-1")
	require.Equal(t, http.StatusConflict, a.status, "the key stays in progress: %s", a.body)
	require.EqualValues(t, 1, u.runs.Load())
}
