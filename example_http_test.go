package idem_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idemkit/idem"
)

func ExampleGuard_Middleware() {
	g, stop := newExampleGuard()
	defer stop()

	var charges atomic.Int64
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, _ := idem.AttemptFrom(r.Context())
		_ = a.ID // pass it to the payment provider as its idempotency key
		charges.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/payments/1")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"1","status":"paid"}`)
	})

	// Keys belong to the authenticated account: scope them by it.
	account := func(r *http.Request) string { return r.Header.Get("X-Account") }
	mux := http.NewServeMux()
	mux.Handle("POST /payments", g.Middleware(idem.WithScope(account))(pay))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	send := func(key, body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Account", "acct_42")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), b)
	}
	send("8e03978e-40d5-43e8-bc93-6894a57f9324", `{"amount": 1000, "currency": "EUR"}`)
	send("8e03978e-40d5-43e8-bc93-6894a57f9324", `{"currency":"EUR","amount":1000}`) // a retry
	send("8e03978e-40d5-43e8-bc93-6894a57f9324", `{"amount": 5000, "currency": "EUR"}`)
	fmt.Println("charges:", charges.Load())
	// Output:
	// 201 replayed="" {"id":"1","status":"paid"}
	// 201 replayed="true" {"id":"1","status":"paid"}
	// 422 replayed="" {"type":"https://github.com/idemkit/idem/blob/main/docs/http.md#key-reused","title":"Idempotency key reused","status":422,"detail":"This Idempotency-Key was already used with a different request (method, path, query or body). Use a new key for a new operation; reuse a key only to retry exactly the same request."}
	// charges: 1
}
