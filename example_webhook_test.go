package idem_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemkit/idem"
)

// sendWebhook posts body to h with the given header pairs and prints the
// answer.
func sendWebhook(h http.Handler, body string, header ...string) {
	r := httptest.NewRequest(http.MethodPost, "/webhooks", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	fmt.Println(strings.TrimSpace(fmt.Sprintf("%d replayed=%q %s", w.Code, w.Header().Get(idem.ReplayedHeader), w.Body)))
}

// A Stripe-style receiver takes each event's key from its id and compares
// only its type and data: pending_webhooks changes between deliveries of
// one event. Verify the sender's signature before this middleware.
func ExampleWithKeyFunc() {
	g, stop := newExampleGuard()
	defer stop()

	handled := 0
	events := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body) // the whole body, as sent
		handled++
		fmt.Fprintf(w, "handled %d bytes", len(body))
	})
	h := g.Middleware(
		idem.WithKeyFunc(idem.KeyFromJSON("/id")),
		idem.WithFingerprint(idem.FingerprintJSON("/type", "/data")),
	)(events)

	sendWebhook(h, `{"id":"evt_1","type":"charge.succeeded","pending_webhooks":2,"data":{"amount":1000}}`)
	sendWebhook(h, `{"id":"evt_1","type":"charge.succeeded","pending_webhooks":1,"data":{"amount":1000}}`) // redelivered
	sendWebhook(h, `{"id":"evt_1","type":"charge.succeeded","pending_webhooks":1,"data":{"amount":9999}}`)
	sendWebhook(h, `not json`)
	fmt.Println("handled:", handled)
	// Output:
	// 200 replayed="" handled 84 bytes
	// 200 replayed="true" handled 84 bytes
	// 422 replayed="" {"type":"https://github.com/idemkit/idem/blob/main/docs/http.md#key-reused","title":"Idempotency key reused","status":422,"detail":"This idempotency key was already used with a different request (method, path, or the parts of it this route compares). Use a new key for a new operation; reuse a key only to retry exactly the same request."}
	// 400 replayed="" {"type":"https://github.com/idemkit/idem/blob/main/docs/http.md#key-invalid","title":"Idempotency key invalid","status":400,"detail":"The idempotency key could not be taken from the request (body is not JSON: invalid character 'o' in literal null (expecting 'u')). Nothing was done."}
	// handled: 1
}

// A Standard Webhooks (Svix) receiver takes the key from the webhook-id
// header; GitHub's is X-GitHub-Delivery, Shopify's X-Shopify-Webhook-Id.
func ExampleWithKeyHeader() {
	g, stop := newExampleGuard()
	defer stop()

	h := g.Middleware(idem.WithKeyHeader("webhook-id"))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	sendWebhook(h, `{"type":"invoice.paid","timestamp":"2024-05-01T10:00:00Z","data":{}}`, "webhook-id", "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W")
	sendWebhook(h, `{"type":"invoice.paid","timestamp":"2024-05-01T10:00:00Z","data":{}}`, "webhook-id", "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W")
	// Output:
	// 200 replayed="" ok
	// 200 replayed="true" ok
}

// An API may compare only the fields that define the operation, leaving
// out a client's per-attempt details.
func ExampleWithFingerprint() {
	g, stop := newExampleGuard()
	defer stop()

	h := g.Middleware(idem.WithFingerprint(idem.FingerprintJSON("/amount", "/currency")))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	for _, body := range []string{
		`{"amount":1000,"currency":"EUR","sent_at":"10:00:00"}`,
		`{"amount":1000,"currency":"EUR","sent_at":"10:00:05"}`, // a retry
	} {
		sendWebhook(h, body, "Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
	}
	// Output:
	// 201 replayed=""
	// 201 replayed="true"
}
