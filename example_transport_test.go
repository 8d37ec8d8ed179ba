package idem_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemkit/idem"
)

// A library that retries on its own, here go-retryablehttp, calls the
// transport once per attempt, and each call is a new request to it: the key
// must come from the caller, made with NewKey when the intent is created and
// passed with WithKey on every attempt.
func ExampleNewTransport_retryablehttp() {
	g, stop := newExampleGuard()
	defer stop()

	var charges atomic.Int64
	api := g.Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid")
	}))
	// A gateway loses the first answer after the server processed the
	// request, and answers 502; go-retryablehttp retries that.
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 1 {
			api.ServeHTTP(httptest.NewRecorder(), r)
			http.Error(w, "upstream connection lost", http.StatusBadGateway)
			return
		}
		api.ServeHTTP(w, r)
	}))
	defer srv.Close()

	client := retryablehttp.NewClient()
	client.Logger = nil
	client.RetryWaitMin, client.RetryWaitMax = 10*time.Millisecond, 100*time.Millisecond
	client.HTTPClient.Transport = idem.NewTransport(client.HTTPClient.Transport)

	ctx := idem.WithKey(context.Background(), idem.NewKey()) // one key for the intent
	req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, srv.URL, []byte(`{"amount":1000}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	resp, err := client.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed"))
	fmt.Println("requests:", requests.Load(), "charges:", charges.Load())
	// Output:
	// 201 paid true
	// requests: 2 charges: 1
}
