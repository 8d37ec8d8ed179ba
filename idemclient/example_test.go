package idemclient_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idemtest"
)

func ExampleNewTransport() {
	g := idemtest.NewGuard() // the server's side; in production on Redis

	var charges atomic.Int64
	api := g.Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid")
	}))
	// The network loses the first answer, after the server processed the
	// request: the client cannot know whether it was charged.
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 1 {
			api.ServeHTTP(httptest.NewRecorder(), r)
			panic(http.ErrAbortHandler) // the connection drops
		}
		api.ServeHTTP(w, r)
	}))
	defer srv.Close()

	client := &http.Client{Transport: idemclient.NewTransport(nil)}
	// Create the key when the intent is created (the Pay button is shown)
	// and keep it with the intent; the transport sends it on every attempt.
	ctx := idemclient.WithKey(context.Background(), idemclient.NewKey())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{"amount":1000}`))
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

// A library that retries on its own, here go-retryablehttp, calls the
// transport once per attempt, and each call is a new request to it: the key
// must come from the caller, made with NewKey when the intent is created and
// passed with WithKey on every attempt.
func ExampleNewTransport_retryablehttp() {
	g := idemtest.NewGuard() // the server's side; in production on Redis

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
	client.HTTPClient.Transport = idemclient.NewTransport(client.HTTPClient.Transport)

	ctx := idemclient.WithKey(context.Background(), idemclient.NewKey()) // one key for the intent
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
