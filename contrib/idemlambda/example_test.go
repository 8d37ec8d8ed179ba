package idemlambda_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/alicebob/miniredis/v2"
	"github.com/aws/aws-lambda-go/events"
	"github.com/awslabs/aws-lambda-go-api-proxy/httpadapter"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemlambda"
)

// discard drops the log of the records SQS reports.
var discard = slog.New(slog.DiscardHandler)

// exampleRedis starts an embedded Redis for an example; a function uses
// ElastiCache, MemoryDB or another Redis.
func exampleRedis() (*redis.Client, func()) {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	return rdb, func() { _ = rdb.Close(); mr.Close() }
}

func ExampleHandler() {
	rdb, stop := exampleRedis()
	defer stop()
	// Made once per instance, outside the handler.
	g := idem.New(idem.NewRedisStore(rdb))

	type Payment struct {
		RequestID string `json:"request_id"`
		Amount    int    `json:"amount"`
	}
	charge := func(ctx context.Context, p Payment) (string, error) {
		a, _ := idem.AttemptFrom(ctx) // a.ID: the payment provider's idempotency key
		fmt.Println("charging", p.Amount, "attempt", a.Fence)
		return "receipt for " + p.RequestID, nil
	}
	fn := idemlambda.Handler(g, func(_ context.Context, p Payment) (string, error) { return p.RequestID, nil }, charge)
	// In main: lambda.Start(fn). Here, three invocations of one event, as an
	// asynchronous invocation's retries deliver it:
	for range 3 {
		fmt.Println(fn(context.Background(), Payment{RequestID: "req-1", Amount: 1000}))
	}
	_, err := fn(context.Background(), Payment{RequestID: "req-1", Amount: 2000})
	fmt.Println("another amount:", errors.Is(err, idem.ErrMismatch))
	// Output:
	// charging 1000 attempt 1
	// receipt for req-1 <nil>
	// receipt for req-1 <nil>
	// receipt for req-1 <nil>
	// another amount: true
}

func ExampleSQS() {
	rdb, stop := exampleRedis()
	defer stop()
	g := idem.New(idem.NewRedisStore(rdb))

	orderID := idem.KeyFromJSON("/order") // the order id in the body: one order, one shipment
	fn := idemlambda.SQS(g, func(ctx context.Context, m events.SQSMessage) error {
		if m.Body == `{"order":"o-3"}` {
			return errors.New("warehouse unreachable")
		}
		fmt.Println("shipping", m.Body)
		return nil
	}, idemlambda.WithSQSKey(func(m events.SQSMessage) (string, error) { return orderID(nil, []byte(m.Body)) }),
		idemlambda.WithLogger(discard))
	// In main: lambda.Start(fn), with ReportBatchItemFailures on the event source mapping.
	batch := events.SQSEvent{Records: []events.SQSMessage{
		{MessageId: "m-1", Body: `{"order":"o-1"}`},
		{MessageId: "m-2", Body: `{"order":"o-2"}`},
		{MessageId: "m-3", Body: `{"order":"o-3"}`}, // fails
		{MessageId: "m-4", Body: `{"no":"order"}`},  // no key
		{MessageId: "m-5", Body: `{"order":"o-1"}`}, // the producer sent o-1 twice
	}}
	resp, _ := fn(context.Background(), batch)
	fmt.Println("delivered again:", resp.BatchItemFailures)
	resp, _ = fn(context.Background(), batch) // SQS redelivers the batch
	fmt.Println("delivered again:", resp.BatchItemFailures)
	// Output:
	// shipping {"order":"o-1"}
	// shipping {"order":"o-2"}
	// delivered again: [{m-3} {m-4}]
	// delivered again: [{m-3} {m-4}]
}

// An HTTP function (API Gateway, a function URL) keeps g.Middleware behind
// aws-lambda-go-api-proxy; LeaseContext ends its claims' leases with the
// invocation.
func ExampleLeaseContext() {
	rdb, stop := exampleRedis()
	defer stop()
	g := idem.New(idem.NewRedisStore(rdb))

	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("charging")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"charge":"ch_1"}`)
	})
	adapter := httpadapter.NewV2(g.Middleware()(mux))
	fn := func(ctx context.Context, e events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		return adapter.ProxyWithContext(idemlambda.LeaseContext(ctx), e)
	}
	// In main: lambda.Start(fn).
	e := events.APIGatewayV2HTTPRequest{
		RawPath: "/payments", Body: `{"amount":1000}`,
		Headers: map[string]string{"idempotency-key": "8e0f5a2c-1d4b-4f3e-9a7c-2b6d0e1f3a5c"},
		RequestContext: events.APIGatewayV2HTTPRequestContext{
			HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: "POST", Path: "/payments"},
		},
	}
	for range 2 {
		resp, err := fn(context.Background(), e)
		fmt.Println(resp.StatusCode, resp.Body, "replayed:", resp.Headers["Idempotent-Replayed"] == "true", err)
	}
	// Output:
	// charging
	// 201 {"charge":"ch_1"} replayed: false <nil>
	// 201 {"charge":"ch_1"} replayed: true <nil>
}
