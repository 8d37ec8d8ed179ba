package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
)

var (
	httpReqBody  = []byte(`{"amount":1250,"currency":"EUR","customer":"cus_0123456789"}`)
	httpRespBody = bytes.Repeat([]byte("x"), 200)
)

// payHandler is the bare handler: it reads the request, performs its side
// effect (a counter) and answers 201 with a 200-byte JSON-typed body.
func payHandler(effects *atomic.Int64, body []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		effects.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	})
}

// httpTarget is one server: httptest.Server on loopback, real TCP.
type httpTarget struct {
	srv     *httptest.Server
	client  *http.Client
	effects atomic.Int64
	status  [600]atomic.Int64
	replays atomic.Int64
}

func newHTTPTarget(e *env, wrap func(http.Handler) http.Handler, body []byte) *httpTarget {
	t := &httpTarget{}
	h := payHandler(&t.effects, body)
	if wrap != nil {
		h = wrap(h)
	}
	t.srv = httptest.NewServer(h)
	t.client = &http.Client{
		Transport: &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 512, IdleConnTimeout: time.Minute},
		Timeout:   30 * time.Second,
	}
	e.onClose(func() {
		t.client.CloseIdleConnections()
		t.srv.Close()
	})
	return t
}

// post sends one POST with key (if not empty) and drains the answer.
func (t *httpTarget) post(ctx context.Context, key string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.srv.URL+"/payments", bytes.NewReader(httpReqBody))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode > 0 && resp.StatusCode < len(t.status) {
		t.status[resp.StatusCode].Add(1)
	}
	if resp.Header.Get("Idempotent-Replayed") == "true" {
		t.replays.Add(1)
	}
	return resp.StatusCode, nil
}

func (t *httpTarget) statusSummary() string {
	var s string
	for code := range t.status {
		if n := t.status[code].Load(); n > 0 {
			s += fmt.Sprintf(" %d×%d", code, n)
		}
	}
	return s
}

// runHTTP is scenario 2: a bare handler vs the same handler behind
// g.Middleware, both served by httptest.Server over loopback TCP.
func runHTTP(ctx context.Context, e *env) error {
	clients := e.cfg.clients
	base := "h-" + e.nonce
	rc, rh := e.client(0, clients)
	g := e.guard(rc, base)
	mw := middleware(g)
	bare := newHTTPTarget(e, nil, httpRespBody)
	with := newHTTPTarget(e, mw, httpRespBody)
	want := func(code int, err error) error {
		if err == nil && code != http.StatusCreated {
			err = fmt.Errorf("status %d", code)
		}
		return err
	}

	progress("scenario 2: HTTP, %d clients", clients)
	freshKeys := keyer("hf")
	bareFresh := &variant{name: "bare handler", clients: clients, srv: e.serverUsec,
		op: func(ctx context.Context, w int, seq uint64) error {
			return want(bare.post(ctx, freshKeys.key(w, seq)))
		}}
	mwFresh := &variant{name: "g.Middleware, fresh keys", clients: clients, rt: rh.n, srv: e.serverUsec,
		op: func(ctx context.Context, w int, seq uint64) error {
			return want(with.post(ctx, freshKeys.key(w, seq)))
		}}
	if err := compare(ctx, e.cfg, "HTTP fresh keys", bareFresh, mwFresh); err != nil {
		return err
	}

	n := e.cfg.replayKeys
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "hr-" + strconv.Itoa(i)
	}
	bareReplay := &variant{name: "bare handler", clients: clients, srv: e.serverUsec,
		op: func(ctx context.Context, w int, seq uint64) error {
			return want(bare.post(ctx, keys[(uint64(w)*7919+seq)%uint64(n)]))
		}}
	effects0 := with.effects.Load()
	mwReplay := &variant{name: "g.Middleware, replays", clients: clients, rt: rh.n, srv: e.serverUsec,
		setup: func(ctx context.Context) error {
			err := populate(ctx, n, func(ctx context.Context, i int) error { return want(with.post(ctx, keys[i])) })
			effects0 = with.effects.Load()
			return err
		},
		op: func(ctx context.Context, w int, seq uint64) error {
			err := want(with.post(ctx, keys[(uint64(w)*7919+seq)%uint64(n)]))
			if err == nil && with.effects.Load() != effects0 {
				err = fmt.Errorf("a replay ran the handler")
			}
			return err
		}}
	if err := compare(ctx, e.cfg, "HTTP replays", bareReplay, mwReplay); err != nil {
		return err
	}

	// 16 clients hammer one key per round: the first request runs the
	// handler, concurrent ones get 409 + Retry-After, later ones the replay.
	ham := newHTTPTarget(e, mw, httpRespBody)
	var round atomic.Int64
	hamKey := func() string { return "hammer-" + strconv.FormatInt(round.Load(), 10) }
	ok := func(code int, err error) error {
		if err == nil && code != http.StatusCreated && code != http.StatusConflict {
			err = fmt.Errorf("status %d", code)
		}
		return err
	}
	bareHammer := &variant{name: "bare handler, one key", clients: clients, srv: e.serverUsec,
		op: func(ctx context.Context, w int, seq uint64) error { return want(bare.post(ctx, "hammer")) }}
	mwHammer := &variant{name: "g.Middleware, one key", clients: clients, rt: rh.n, srv: e.serverUsec,
		before: func(ctx context.Context) error { round.Add(1); return nil },
		op:     func(ctx context.Context, w int, seq uint64) error { return ok(ham.post(ctx, hamKey())) }}
	if err := compare(ctx, e.cfg, "HTTP one key", bareHammer, mwHammer); err != nil {
		return err
	}
	keysUsed := round.Load()
	sec := e.rep.section("2. HTTP: bare handler vs g.Middleware",
		fmt.Sprintf("%d clients; each side is an `httptest.Server` on loopback TCP (keep-alive `http.Client`), so both "+
			"include the HTTP stack; the handler reads a 60 B JSON body and answers 201 with 200 B. Allocations are "+
			"the whole process's (client and server). The middleware's Redis client is counted for round trips. "+
			"One-key: a new key each round (%d keys), hammered by all clients: the handler ran %d times; answers:%s (replayed: %d).",
			clients, keysUsed, ham.effects.Load(), ham.statusSummary(), ham.replays.Load()))
	sec.pair(bareFresh, mwFresh)
	sec.pair(bareReplay, mwReplay)
	sec.pair(bareHammer, mwHammer)
	e.rep.maxTarget("HTTP: round trips per fresh request (batched by default: shared round trips count as less)", mwFresh.rtPerOp(), 2, fmtF(mwFresh.rtPerOp(), 2), "≤ 2")
	e.rep.maxTarget("HTTP: round trips per replay (batched by default: shared round trips count as less)", mwReplay.rtPerOp(), 1, fmtF(mwReplay.rtPerOp(), 2), "≤ 1")
	e.rep.exactTarget("HTTP one key: handler runs per key", float64(ham.effects.Load())/float64(max(keysUsed, 1)), 1)
	return nil
}

// middleware returns g's HTTP middleware with its default options.
func middleware(g *idem.Guard) func(http.Handler) http.Handler { return g.Middleware() }
