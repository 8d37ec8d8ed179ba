package idem_test

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// receiver is a webhook handler that counts its side effects (one per
// event it processes) and answers with what it read of the body.
type receiver struct {
	runs atomic.Int64
	mu   sync.Mutex
	seen map[string]int // side effects per event id
}

func newReceiver() *receiver { return &receiver{seen: map[string]int{}} }

func (v *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	n := v.runs.Add(1)
	var ev struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(body, &ev)
	v.mu.Lock()
	v.seen[ev.ID]++
	v.mu.Unlock()
	time.Sleep(2 * time.Millisecond) // the effect takes time: duplicates overlap it
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"run":%d,"read":%d}`, n, len(body))
}

// stripeEvent is a Stripe-style event: pending_webhooks changes between
// deliveries of one event.
func stripeEvent(id string, amount, pending int) string {
	return fmt.Sprintf(`{"id":%q,"object":"event","type":"charge.succeeded","pending_webhooks":%d,"data":{"object":{"id":"ch_1","amount":%d,"currency":"eur"}}}`, id, pending, amount)
}

// deliver posts a webhook body, with extra headers, and no Idempotency-Key.
func deliver(h http.Handler, body string, header ...string) *httptest.ResponseRecorder {
	q := req{path: "/webhooks/stripe", body: body, contentType: "application/json", header: http.Header{}}
	for i := 0; i+1 < len(header); i += 2 {
		q.header.Set(header[i], header[i+1])
	}
	return serve(h, q)
}

func stripeRoute(g *idem.Guard, opts ...idem.HTTPOption) func(http.Handler) http.Handler {
	return g.Middleware(append([]idem.HTTPOption{
		idem.WithKeyFunc(idem.KeyFromJSON("/id")),
		idem.WithFingerprint(idem.FingerprintJSON("/type", "/data")),
	}, opts...)...)
}

func TestWebhookRedeliveries(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		v := newReceiver()
		h := stripeRoute(b.guard(t))(v)

		first := deliver(h, stripeEvent("evt_1", 1000, 3))
		require.Equal(t, http.StatusOK, first.Code, "%s", first.Body)
		require.Empty(t, first.Header().Get(idem.ReplayedHeader))

		// Another attempt: pending_webhooks changed, members reordered.
		again := deliver(h, `{"data":{"object":{"currency":"eur","amount":1000,"id":"ch_1"}},"pending_webhooks":2,"type":"charge.succeeded","object":"event","id":"evt_1"}`)
		require.Equal(t, http.StatusOK, again.Code, "%s", again.Body)
		require.Equal(t, "true", again.Header().Get(idem.ReplayedHeader))
		require.Equal(t, first.Body.String(), again.Body.String())

		// The same id with another amount is another request.
		other := deliver(h, stripeEvent("evt_1", 2000, 1))
		p := requireProblem(t, other, http.StatusUnprocessableEntity, "key-reused")
		require.Contains(t, p.Detail, "idempotency key was already used")

		// Another event runs.
		require.Equal(t, http.StatusOK, deliver(h, stripeEvent("evt_2", 1000, 1)).Code)
		require.EqualValues(t, 2, v.runs.Load())
	})
}

// TestWebhookConcurrentDeliveries: 24 deliveries of one event at once run
// the handler once; with the Guard's wait every one gets its answer.
func TestWebhookConcurrentDeliveries(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		v := newReceiver()
		srv := httptest.NewServer(stripeRoute(b.guard(t, idem.WithWait(30*time.Second)))(v))
		t.Cleanup(srv.Close)
		const n = 24
		answers := make(chan answer, n)
		for i := range n {
			go func() {
				r, err := http.NewRequest(http.MethodPost, srv.URL+"/webhooks/stripe", strings.NewReader(stripeEvent("evt_c", 500, n-i)))
				if err != nil {
					answers <- answer{err: err}
					return
				}
				r.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(r)
				if err != nil {
					answers <- answer{err: err}
					return
				}
				defer resp.Body.Close()
				body, err := io.ReadAll(resp.Body)
				answers <- answer{status: resp.StatusCode, replayed: resp.Header.Get(idem.ReplayedHeader) == "true", body: body, err: err}
			}()
		}
		bodies := map[string]int{}
		for range n {
			a := <-answers
			require.NoError(t, a.err)
			require.Equal(t, http.StatusOK, a.status, "%s", a.body)
			bodies[string(a.body)]++
		}
		require.Len(t, bodies, 1, "every delivery got the one answer")
		require.EqualValues(t, 1, v.runs.Load())
		require.Equal(t, map[string]int{"evt_c": 1}, v.seen)
	})
}

// TestWebhookTenantsApart: two tenants' equal event ids are two operations.
func TestWebhookTenantsApart(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		v := newReceiver()
		h := stripeRoute(b.guard(t), idem.WithScope(func(r *http.Request) string { return r.Header.Get("X-Tenant") }))(v)
		a1 := deliver(h, stripeEvent("evt_t", 100, 1), "X-Tenant", "acme")
		b1 := deliver(h, stripeEvent("evt_t", 999, 1), "X-Tenant", "globex")
		require.Equal(t, http.StatusOK, a1.Code)
		require.Equal(t, http.StatusOK, b1.Code, "another tenant's equal id is no mismatch: %s", b1.Body)
		require.NotEqual(t, a1.Body.String(), b1.Body.String())
		a2 := deliver(h, stripeEvent("evt_t", 100, 2), "X-Tenant", "acme")
		b2 := deliver(h, stripeEvent("evt_t", 999, 2), "X-Tenant", "globex")
		require.Equal(t, a1.Body.String(), a2.Body.String())
		require.Equal(t, b1.Body.String(), b2.Body.String())
		require.Equal(t, "true", b2.Header().Get(idem.ReplayedHeader))
		require.EqualValues(t, 2, v.runs.Load())
	})
}

// TestWebhookRefusals: bodies and keys the functions cannot use get a 400
// problem naming the reason; the handler does not run and the store is not
// asked.
func TestWebhookRefusals(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		v := newReceiver()
		h := stripeRoute(b.guard(t))(v)
		tests := []struct {
			name, body, slug, detail string
		}{
			{name: "not JSON", body: `id=evt_1`, slug: "key-invalid", detail: "body is not JSON"},
			{name: "empty body", body: ``, slug: "key-invalid", detail: "body is not JSON"},
			{name: "two documents", body: `{"id":"a"}{"id":"b"}`, slug: "key-invalid", detail: "body is not JSON"},
			{name: "no id", body: `{"type":"x","data":{}}`, slug: "key-invalid", detail: "/id: no such member"},
			{name: "id is an object", body: `{"id":{"x":1},"type":"x","data":{}}`, slug: "key-invalid", detail: "/id is an object, not a string or a number"},
			{name: "id is null", body: `{"id":null}`, slug: "key-invalid", detail: "is null"},
			{name: "two ids", body: `{"id":"a","ID":"b","type":"x","data":{}}`, slug: "key-invalid", detail: "more than one member"},
			{name: "empty id", body: `{"id":"","type":"x","data":{}}`, slug: "key-missing", detail: "carries no idempotency key"},
			{name: "id not ASCII", body: `{"id":"évt","type":"x","data":{}}`, slug: "key-invalid", detail: "not printable ASCII"},
			{name: "id too long", body: `{"id":"` + strings.Repeat("e", 256) + `","type":"x","data":{}}`, slug: "key-invalid", detail: "more than 255"},
			{name: "no data", body: `{"id":"evt_9","type":"x"}`, slug: "fingerprint-failed", detail: "/data: no such member"},
			{name: "nested too deep", body: `{"id":"e","data":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`, slug: "key-invalid", detail: "depth"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				rec := deliver(h, tt.body)
				p := requireProblem(t, rec, http.StatusBadRequest, tt.slug)
				require.Contains(t, p.Detail, tt.detail)
				require.Equal(t, "no-store", rec.Header().Get("Cache-Control"))
			})
		}
		require.Zero(t, v.runs.Load())
		require.Zero(t, storeKeys(t, b.client, b.prefix))
	})
}

// TestKeyFuncErrorsNamed: errors of the application's own functions reach
// the problem's detail.
func TestKeyFuncErrorsNamed(t *testing.T) {
	v := newReceiver()
	g := idem.New(&cannedStore{}, quiet)
	h := g.Middleware(idem.WithKeyFunc(func(r *http.Request, body []byte) (string, error) {
		return "", errors.New("idem: no delivery id in X-Delivery")
	}))(v)
	p := requireProblem(t, deliver(h, `{}`), http.StatusBadRequest, "key-invalid")
	require.Equal(t, "The idempotency key could not be taken from the request (no delivery id in X-Delivery). Nothing was done.", p.Detail)

	h = g.Middleware(idem.WithFingerprint(func(r *http.Request, body []byte) ([]byte, error) {
		return nil, errors.New("signature version unknown")
	}))(v)
	rec := serve(h, req{key: "k", body: `{}`})
	p = requireProblem(t, rec, http.StatusBadRequest, "fingerprint-failed")
	require.Contains(t, p.Detail, "(signature version unknown)")
	require.Contains(t, p.Detail, "Idempotency-Key")
	require.Zero(t, v.runs.Load())
}

// TestKeyFuncBody: the functions and the handler see the same bytes, the
// whole body up to WithMaxRequestBody; a larger body gets 413 before the
// key function runs.
func TestKeyFuncBody(t *testing.T) {
	const limit = 64
	var seen atomic.Int64
	keyOf := idem.KeyFromJSON("/id")
	g := idem.New(&cannedStore{}, quiet)
	h := g.Middleware(idem.WithMaxRequestBody(limit), idem.WithKeyFunc(func(r *http.Request, body []byte) (string, error) {
		seen.Store(int64(len(body)))
		require.Equal(t, len(body), cap(body), "nothing past the body is reachable")
		return keyOf(r, body)
	}))(newReceiver())
	body := `{"id":"evt_b","pad":"` + strings.Repeat("x", limit-len(`{"id":"evt_b","pad":""}`)) + `"}`
	require.Len(t, body, limit)
	for _, length := range []int64{limit, -1} { // announced, or chunked
		r := req{body: body, contentType: "application/json"}.build()
		r.ContentLength = length
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		require.Equal(t, http.StatusOK, rec.Code, "%s", rec.Body)
		require.Contains(t, rec.Body.String(), fmt.Sprintf(`"read":%d`, limit), "the handler reads the whole body")
		require.EqualValues(t, limit, seen.Load())
	}
	seen.Store(0)
	rec := deliver(h, body[:limit-2]+`x"}`)
	requireProblem(t, rec, http.StatusRequestEntityTooLarge, "body-too-large")
	require.Zero(t, seen.Load(), "the key function does not run on a body too large")
}

// TestKeyFuncOptional: under WithOptionalKey, a request whose function
// finds no key runs unprotected, with its whole body, and touches no store.
func TestKeyFuncOptional(t *testing.T) {
	v := newReceiver()
	g := idem.New(&failingStore{claim: true}, quiet) // a claim would fail the request
	h := g.Middleware(idem.WithOptionalKey(), idem.WithKeyFunc(func(r *http.Request, body []byte) (string, error) {
		return r.Header.Get("X-Delivery"), nil
	}))(v)
	for range 2 {
		rec := deliver(h, `{"event":"ping"}`)
		require.Equal(t, http.StatusOK, rec.Code)
		require.Empty(t, rec.Header().Get(idem.ReplayedHeader))
	}
	require.JSONEq(t, `{"run":3,"read":16}`, deliver(h, `{"event":"ping"}`).Body.String(), "the handler reads the whole body")
	require.EqualValues(t, 3, v.runs.Load())
	requireProblem(t, deliver(h, `{}`, "X-Delivery", "d\x01"), http.StatusBadRequest, "key-invalid")
}

// TestKeyFromHeaderOfSender: Standard Webhooks and GitHub name each
// delivery in a header; WithKeyHeader takes the key from it.
func TestKeyFromHeaderOfSender(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		v := newReceiver()
		g := b.guard(t)
		for _, header := range []string{"webhook-id", "X-GitHub-Delivery", "X-Shopify-Webhook-Id"} {
			h := g.Middleware(idem.WithKeyHeader(header), idem.WithScope(func(*http.Request) string { return header }))(v)
			first := deliver(h, `{"type":"ping"}`, header, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W")
			again := deliver(h, `{"type":"ping"}`, header, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W")
			require.Equal(t, http.StatusOK, first.Code)
			require.Equal(t, "true", again.Header().Get(idem.ReplayedHeader))
			requireProblem(t, deliver(h, `{"type":"ping"}`), http.StatusBadRequest, "key-missing")
		}
		require.EqualValues(t, 3, v.runs.Load())
	})
}

// TestFingerprintKeepsPath: with WithFingerprint the method and path stay
// compared, so one key used on two routes is refused on the second.
func TestFingerprintKeepsPath(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		v := newReceiver()
		h := b.guard(t).Middleware(idem.WithFingerprint(idem.FingerprintJSON("/amount")))(v)
		require.Equal(t, http.StatusOK, serve(h, req{key: "k", path: "/a", body: `{"amount":1,"note":"x"}`}).Code)
		again := serve(h, req{key: "k", path: "/a", body: `{"note":"y","amount":1}`})
		require.Equal(t, "true", again.Header().Get(idem.ReplayedHeader), "the note is not compared")
		requireProblem(t, serve(h, req{key: "k", path: "/b", body: `{"amount":1}`}), http.StatusUnprocessableEntity, "key-reused")
		requireProblem(t, serve(h, req{key: "k", path: "/a", body: `{"amount":2}`}), http.StatusUnprocessableEntity, "key-reused")
		require.EqualValues(t, 1, v.runs.Load())
	})
}

// TestFingerprintSealed: on a sealed Guard the function's fingerprint is
// keyed as the default one is, and compares the same way.
func TestFingerprintSealed(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		k := make([]byte, 32)
		_, _ = rand.Read(k)
		sealer, err := idem.NewAESGCMSealer("k1", map[string][]byte{"k1": k})
		require.NoError(t, err)
		v := newReceiver()
		h := stripeRoute(b.guard(t, idem.WithSealer(sealer)))(v)
		first := deliver(h, stripeEvent("evt_s", 700, 2))
		require.Equal(t, http.StatusOK, first.Code)
		require.Equal(t, "true", deliver(h, stripeEvent("evt_s", 700, 1)).Header().Get(idem.ReplayedHeader))
		requireProblem(t, deliver(h, stripeEvent("evt_s", 701, 1)), http.StatusUnprocessableEntity, "key-reused")
		require.EqualValues(t, 1, v.runs.Load())
	})
}

func TestKeyFuncOptionsRejected(t *testing.T) {
	g := idem.New(&cannedStore{}, quiet)
	key := idem.KeyFromJSON("/id")
	tests := []struct {
		name string
		f    func()
		msg  string
	}{
		{"key func and header", func() { g.Middleware(idem.WithKeyHeader("webhook-id"), idem.WithKeyFunc(key)) }, "WithKeyFunc and WithKeyHeader"},
		{"nil key func", func() { g.Middleware(idem.WithKeyFunc(nil)) }, "WithKeyFunc(nil)"},
		{"nil fingerprint", func() { g.Middleware(idem.WithFingerprint(nil)) }, "WithFingerprint(nil)"},
		{"bad pointer", func() { idem.KeyFromJSON("id") }, "does not start with /"},
		{"bad escape", func() { idem.FingerprintJSON("/a~2") }, "~ must be followed by 0 or 1"},
		{"no pointer", func() { idem.FingerprintJSON() }, "no pointer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				r := recover()
				require.NotNil(t, r)
				require.Contains(t, fmt.Sprint(r), tt.msg)
			}()
			tt.f()
		})
	}
}

// TestKeyFuncObserved: on a key function's route the Observer hears of each
// protected request, its refusals included, and of none that ran
// unprotected.
func TestKeyFuncObserved(t *testing.T) {
	obs := &recObserver{}
	c := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { c.Close() })
	g := idem.New(idem.NewRedisStore(c), quiet, idem.WithObserver(obs))
	h := stripeRoute(g, idem.WithOptionalKey(), idem.WithMaxRequestBody(512))(newReceiver())
	for _, tt := range []struct {
		body    string
		outcome idem.Outcome
	}{
		{stripeEvent("evt_o", 1, 1), idem.OutcomeExecuted},
		{stripeEvent("evt_o", 1, 2), idem.OutcomeReplayed},
		{stripeEvent("evt_o", 2, 2), idem.OutcomeMismatch},
		{`not json`, idem.OutcomeInvalidKey},
		{`{"id":"evt_p","type":"x"}`, idem.OutcomeInvalidKey},
		{`{"id":"` + strings.Repeat("x", 600) + `"}`, idem.OutcomeTooLarge},
	} {
		deliver(h, tt.body)
		require.Equal(t, tt.outcome, obs.last(t).Outcome, tt.body)
	}
	sawKind := false
	deliver(stripeRoute(g)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawKind = r.Context().Value(obsKey{}) == idem.KindHTTP
	})), stripeEvent("evt_ctx", 1, 1))
	require.True(t, sawKind, "the handler runs under the context Start returned")
	require.Equal(t, idem.OutcomeExecuted, obs.last(t).Outcome)
	require.Equal(t, http.StatusOK, deliver(h, `{"id":"","type":"x","data":{}}`).Code, "no key: unprotected")
	require.Empty(t, obs.events)
	require.Zero(t, obs.starts)
}
