package verify

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
)

// Via is the entry point through which a Workload calls idem.
type Via int

// The entry points of a Workload's calls.
const (
	// ViaDo calls idem.Do.
	ViaDo Via = iota
	// ViaHTTP posts the request, with its key in an Idempotency-Key
	// header, to Guard.Middleware on a loopback HTTP server (one per
	// Guard) whose handler runs the function. Give every Guard
	// WithObserver(Observer()): a response the handler sent although its
	// record could not be written then counts as not recorded, as the
	// engine's error says, not as a result handed out.
	ViaHTTP
	// ViaOnce calls Guard.Once, with the key as the message id.
	ViaOnce
	// ViaAll sends each key through one of the three, chosen by the key's
	// number: every call of a key goes the same way.
	ViaAll
)

// String returns "do", "http", "once" or "all".
func (v Via) String() string {
	switch v {
	case ViaDo:
		return "do"
	case ViaHTTP:
		return "http"
	case ViaOnce:
		return "once"
	case ViaAll:
		return "all"
	}
	return "via(" + strconv.Itoa(int(v)) + ")"
}

// callHeader carries the ID of the call a request belongs to, so that the
// server side of ViaHTTP records in the same Op.
const callHeader = "Verify-Call"

// webCall is a call of ViaHTTP as the server side sees it.
type webCall struct {
	w   *Workload
	op  *Op
	rnd *rand.Rand
	s   *Sink
	key string

	state atomic.Int32 // 0 new, 1 served, 2 abandoned by the client before it was served
	done  chan struct{}
	event atomic.Pointer[idem.Event] // the middleware's end of the operation, by Observer
}

type webCallKey struct{}

// webs holds the HTTP servers of ViaHTTP, one per Guard.
type webs struct {
	mu      sync.Mutex
	servers map[*idem.Guard]*web
	calls   sync.Map // call ID → *webCall
}

// web is a loopback HTTP server running a Guard's middleware, and its client.
type web struct {
	srv    *httptest.Server
	client *http.Client
}

// get returns g's server, starting it on first use.
func (ws *webs) get(g *idem.Guard) *web {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if e := ws.servers[g]; e != nil {
		return e
	}
	if ws.servers == nil {
		ws.servers = make(map[*idem.Guard]*web)
	}
	inner := g.Middleware()(http.HandlerFunc(serveCall))
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		id, _ := strconv.Atoi(r.Header.Get(callHeader))
		v, ok := ws.calls.Load(id)
		if !ok {
			http.Error(rw, "verify: unknown call", http.StatusBadRequest)
			return
		}
		c := v.(*webCall)
		if !c.state.CompareAndSwap(0, 1) {
			http.Error(rw, "verify: call abandoned", http.StatusGone)
			return
		}
		defer close(c.done)
		inner.ServeHTTP(rw, r.WithContext(context.WithValue(r.Context(), webCallKey{}, c)))
	}))
	e := &web{srv: srv, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
	ws.servers[g] = e
	return e
}

// close stops the servers; the next call starts them again.
func (ws *webs) close() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for g, e := range ws.servers {
		e.client.CloseIdleConnections()
		e.srv.Close()
		delete(ws.servers, g)
	}
}

// serveCall is the handler under the middleware: it runs the call's
// function and answers 200 with its result, 402 with a permanent error
// (stored and replayed) or 500 with another error (the key released).
func serveCall(rw http.ResponseWriter, r *http.Request) {
	c, _ := r.Context().Value(webCallKey{}).(*webCall)
	a, ok := idem.AttemptFrom(r.Context())
	if c == nil || !ok {
		http.Error(rw, "verify: no call or no attempt", http.StatusInternalServerError)
		return
	}
	v, err := c.w.fn(r.Context(), c.rnd, c.op, c.s, c.key, a)
	rw.Header().Set("Content-Type", "text/plain")
	switch {
	case err == nil:
		rw.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(rw, v)
	case errors.Is(err, idem.ErrPermanent):
		rw.WriteHeader(http.StatusPaymentRequired)
		_, _ = io.WriteString(rw, err.Error())
	default:
		rw.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(rw, err.Error())
	}
}

// callHTTP makes one call through g's middleware and records it in op. It
// reports whether the call failed.
func (w *Workload) callHTTP(ctx context.Context, g *idem.Guard, op *Op, rnd *rand.Rand, s *Sink, key, req string) bool {
	e := w.web.get(g)
	c := &webCall{w: w, op: op, rnd: rnd, s: s, key: key, done: make(chan struct{})}
	w.web.calls.Store(op.ID(), c)
	defer w.web.calls.Delete(op.ID())
	body, _ := json.Marshal(request{Key: key, Action: req})
	hreq, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/pay", bytes.NewReader(body))
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set(idem.DefaultKeyHeader, key)
	hreq.Header.Set(callHeader, strconv.Itoa(op.ID()))
	code, text, err := 0, "", error(nil)
	resp, err := e.client.Do(hreq)
	if err == nil {
		b, rerr := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		code, text, err = resp.StatusCode, string(b), rerr
	}
	at := op.h.Now()
	if !c.state.CompareAndSwap(0, 2) {
		// The server took the call: its outcome is known once it is done
		// (it goes on after a client that gave up, as the middleware
		// detaches the handler).
		t := time.NewTimer(time.Minute)
		select {
		case <-c.done:
		case <-t.C:
		}
		t.Stop()
	}
	kind, value := webOutcome(c.event.Load(), code, text, err)
	if kind == KindOK {
		value = w.unpad(value)
	}
	op.finish(at, kind, value)
	return kind != KindOK
}

// webOutcome classifies a call of ViaHTTP by the engine's error the
// Observer reported (ev), else by the response.
func webOutcome(ev *idem.Event, code int, text string, err error) (Kind, string) {
	if ev != nil && ev.Err != nil {
		return Classify(ev.Err), ""
	}
	if err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return KindCanceled, ""
		}
		return KindFailed, ""
	}
	switch code {
	case http.StatusOK:
		return KindOK, text
	case http.StatusPaymentRequired:
		return KindPermanent, text
	case http.StatusConflict:
		return KindInProgress, ""
	case http.StatusUnprocessableEntity:
		return KindMismatch, ""
	case http.StatusBadRequest:
		return KindInvalidKey, ""
	case http.StatusServiceUnavailable:
		return KindUnavailable, ""
	}
	return KindFailed, ""
}

// Observer returns an idem.Observer that tells a Workload how each request
// of ViaHTTP ended in the engine; see ViaHTTP. It observes nothing else.
func Observer() idem.Observer { return observer{} }

type observer struct{}

func (observer) Start(ctx context.Context, _ idem.Kind) context.Context { return ctx }

func (observer) End(ctx context.Context, e idem.Event) {
	if c, ok := ctx.Value(webCallKey{}).(*webCall); ok {
		c.event.Store(&e)
	}
}
