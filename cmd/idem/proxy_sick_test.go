//go:build unix

package main

// idem proxy in front of a sick Redis and an unreachable upstream, on its
// default settings: a keyed request while Redis is frozen gets 503 within
// the default store budget (1 s), and its retry once Redis answers reaches
// the upstream at once as attempt 1; requests that were never sent to the
// upstream do not count as attempts.

import (
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/gateway"
	"github.com/idemkit/idem/internal/redistest"
)

const (
	// proxySickBound is how long a keyed request may take while Redis is
	// frozen: the default budget (1 s) and scheduling, where go-redis's
	// timeouts and retries took 5 to 10 s.
	proxySickBound = 2500 * time.Millisecond
	// proxyRecovery bounds how long the retries may be refused after Redis
	// answers again: a hang guard.
	proxyRecovery = 10 * time.Second
)

// TestProxyFrozenRedisRefusedWithinBudget: with Redis frozen (SIGSTOP), a
// keyed request gets 503 store-unavailable with Retry-After within the
// default budget and the upstream is not called; once Redis answers, a retry
// with the key (sent until it is not refused, never 409) reaches the
// upstream once, with Idempotency-Attempt: 1.
func TestProxyFrozenRedisRefusedWithinBudget(t *testing.T) {
	srv := redistest.Start(t)
	u := newCounting(t, nil)
	p := startProxy(t, "-upstream", u.srv.URL, "-redis", "redis://"+srv.Addr())
	post := func() answer {
		return send(t, http.MethodPost, p.url+"/charges", `{"amount":100}`, "Idempotency-Key", "frozen-1")
	}
	warm := send(t, http.MethodPost, p.url+"/charges", `{"amount":1}`, "Idempotency-Key", "warm-1")
	require.Equal(t, http.StatusCreated, warm.status, warm.body)

	srv.Pause(t)
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			srv.Resume(t)
		}
	})
	start := time.Now()
	a := post()
	took := time.Since(start)
	t.Logf("503 after %v", took.Round(time.Millisecond))
	require.Equal(t, http.StatusServiceUnavailable, a.status, a.body)
	require.Contains(t, problemType(t, a), "#store-unavailable")
	require.NotEmpty(t, a.header.Get("Retry-After"))
	require.Less(t, took, proxySickBound, "answered within the default store budget")
	require.EqualValues(t, 1, u.runs.Load(), "the upstream is not called")

	srv.Resume(t)
	resumed = true
	back := time.Now()
	deadline := back.Add(proxyRecovery)
	refused := 0
	for {
		a = post()
		require.NotEqual(t, http.StatusConflict, a.status, "retry %d after recovery got 409: the refused request's claim holds the key: %s", refused+1, a.body)
		if a.status != http.StatusServiceUnavailable {
			break
		}
		refused++
		require.True(t, time.Now().Before(deadline), "still 503 %v after Redis resumed", proxyRecovery)
		time.Sleep(10 * time.Millisecond) // a client's pause between retries
	}
	t.Logf("served %v after resume, %d retries refused first", time.Since(back).Round(time.Millisecond), refused)
	require.Equal(t, http.StatusCreated, a.status, a.body)
	seen := u.requests()
	require.Len(t, seen, 2, "the key reached the upstream once")
	require.Equal(t, "frozen-1", seen[1].key)
	require.Equal(t, "1", seen[1].attempt, "the refused request's claim did not count as an attempt")
}

// TestProxyUnsentAttemptsDoNotCount: five requests refused because nothing
// listened on the upstream's address (502 upstream-unreachable, never sent)
// leave the key at attempt 1: the request that reaches the upstream once it
// listens carries Idempotency-Attempt: 1.
func TestProxyUnsentAttemptsDoNotCount(t *testing.T) {
	addr := closedAddr(t)
	p := startProxy(t, proxyArgs(t, "http://"+addr, "-lease", "1m")...)
	post := func() answer {
		return send(t, http.MethodPost, p.url+"/charges", `{"amount":100}`, "Idempotency-Key", "unsent-1")
	}
	for i := range 5 {
		a := post()
		require.Equal(t, http.StatusBadGateway, a.status, "request %d: %s", i+1, a.body)
		require.Equal(t, gateway.ProblemUnreachable, problemType(t, a))
	}

	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	u := newCounting(t, nil)
	u.srv.Close()
	up := httptest.NewUnstartedServer(http.HandlerFunc(u.serve))
	up.Listener = ln
	up.Start()
	t.Cleanup(up.Close)

	a := post()
	require.Equal(t, http.StatusCreated, a.status, a.body)
	seen := u.requests()
	require.Len(t, seen, 1)
	require.Equal(t, "1", seen[0].attempt, "no attempt before it reached the upstream")
}
