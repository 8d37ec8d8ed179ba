package idemlambda_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/awslabs/aws-lambda-go-api-proxy/httpadapter"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemlambda"
)

// payments is an HTTP API: POST /payments charges once per Idempotency-Key.
type payments struct {
	charges atomic.Int32
	started chan struct{} // receives when a charge starts, if not nil
	release chan struct{}
	lease   func(ctx context.Context, id string) // sees the attempt's lease, if not nil
}

func (p *payments) mux() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", func(w http.ResponseWriter, r *http.Request) {
		a, _ := idem.AttemptFrom(r.Context())
		if p.lease != nil {
			p.lease(r.Context(), a.ID)
		}
		if p.started != nil {
			p.started <- struct{}{}
			<-p.release
		}
		n := p.charges.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/payments/ch_%d", n))
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]any{"charge": fmt.Sprintf("ch_%d", n), "fence": a.Fence})
	})
	return mux
}

// apiFunction is an HTTP function as deployed behind API Gateway (HTTP API,
// payload 2.0) or a function URL: the middleware behind
// aws-lambda-go-api-proxy, under the invocation's lease.
func apiFunction(g *idem.Guard, h http.Handler) func(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
	adapter := httpadapter.NewV2(g.Middleware()(h))
	return func(ctx context.Context, e events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		return adapter.ProxyWithContext(idemlambda.LeaseContext(ctx), e)
	}
}

// httpEvent is the event API Gateway sends for a POST /payments.
func httpEvent(key, body string) events.APIGatewayV2HTTPRequest {
	headers := map[string]string{"content-type": "application/json"}
	if key != "" {
		headers["idempotency-key"] = key
	}
	return events.APIGatewayV2HTTPRequest{
		Version: "2.0", RouteKey: "POST /payments", RawPath: "/payments", Headers: headers, Body: body,
		RequestContext: events.APIGatewayV2HTTPRequestContext{
			DomainName: "api.example.com", RequestID: "gw-" + key,
			HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: "POST", Path: "/payments", Protocol: "HTTP/1.1", SourceIP: "192.0.2.1"},
		},
	}
}

func invokeHTTP(t *testing.T, ctx context.Context, fn any, e events.APIGatewayV2HTTPRequest) events.APIGatewayV2HTTPResponse {
	t.Helper()
	body, err := invoke(ctx, fn, e)
	require.NoError(t, err)
	return decode[events.APIGatewayV2HTTPResponse](t, body)
}

// header returns a response header, whichever map the adapter put it in.
func header(r events.APIGatewayV2HTTPResponse, name string) string {
	if v, ok := r.Headers[name]; ok {
		return v
	}
	if vs := r.MultiValueHeaders[name]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}

func TestAPIGatewayMiddleware(t *testing.T) {
	forEachRedis(t, func(t *testing.T, addr string) {
		p := &payments{}
		fnA := apiFunction(newInstance(t, addr).guard, p.mux())
		fnB := apiFunction(newInstance(t, addr).guard, p.mux())
		ctx := context.Background()

		first := invokeHTTP(t, ctx, fnA, httpEvent("key-1", `{"amount":1000}`))
		require.Equal(t, http.StatusCreated, first.StatusCode, first.Body)
		require.Empty(t, header(first, "Idempotent-Replayed"))
		again := invokeHTTP(t, ctx, fnB, httpEvent("key-1", `{"amount":1000}`))
		require.Equal(t, http.StatusCreated, again.StatusCode)
		require.Equal(t, first.Body, again.Body, "the stored response, from another instance")
		require.Equal(t, header(first, "Location"), header(again, "Location"))
		require.Equal(t, "true", header(again, "Idempotent-Replayed"))

		other := invokeHTTP(t, ctx, fnB, httpEvent("key-1", `{"amount":2000}`))
		require.Equal(t, http.StatusUnprocessableEntity, other.StatusCode)
		require.Equal(t, "application/problem+json", header(other, "Content-Type"))
		missing := invokeHTTP(t, ctx, fnA, httpEvent("", `{"amount":1000}`))
		require.Equal(t, http.StatusBadRequest, missing.StatusCode)
		require.Equal(t, int32(1), p.charges.Load())
	})
}

func TestAPIGatewayConcurrentAndLease(t *testing.T) {
	forEachRedis(t, func(t *testing.T, addr string) {
		rdb := newRedisClient(t, addr)
		store := idem.NewRedisStore(rdb)
		g := idem.New(store, idem.WithLease(time.Minute))
		deadline := time.Now().Add(5 * time.Second)
		limit := time.Until(deadline.Add(time.Second))
		pttl := make(chan time.Duration, 1)
		p := &payments{started: make(chan struct{}, 1), release: make(chan struct{}), lease: func(ctx context.Context, id string) {
			_, key := store.Keys(id)
			pttl <- rdb.PTTL(ctx, key).Val()
		}}
		fn := apiFunction(g, p.mux())

		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		done := make(chan events.APIGatewayV2HTTPResponse, 1)
		go func() {
			body, _ := invoke(ctx, fn, httpEvent("key-2", `{"amount":1}`))
			var r events.APIGatewayV2HTTPResponse
			_ = json.Unmarshal(body, &r)
			done <- r
		}()
		<-p.started
		lease := <-pttl
		require.Positive(t, lease)
		require.LessOrEqual(t, lease, limit, "LeaseContext cuts the middleware's lease to the deadline plus a second")

		busy := invokeHTTP(t, context.Background(), apiFunction(newInstance(t, addr).guard, p.mux()), httpEvent("key-2", `{"amount":1}`))
		require.Equal(t, http.StatusConflict, busy.StatusCode)
		require.NotEmpty(t, header(busy, "Retry-After"))
		close(p.release)
		require.Equal(t, http.StatusCreated, (<-done).StatusCode)
	})
}

// REST APIs (API Gateway v1 payloads) go through httpadapter.New the same way.
func TestAPIGatewayV1(t *testing.T) {
	p := &payments{}
	adapter := httpadapter.New(newInstance(t, miniredisAddr(t)).guard.Middleware()(p.mux()))
	fn := func(ctx context.Context, e events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
		return adapter.ProxyWithContext(idemlambda.LeaseContext(ctx), e)
	}
	e := events.APIGatewayProxyRequest{
		HTTPMethod: "POST", Path: "/payments", Body: `{"amount":5}`,
		Headers:           map[string]string{"Idempotency-Key": "key-v1", "Content-Type": "application/json"},
		MultiValueHeaders: map[string][]string{"Idempotency-Key": {"key-v1"}, "Content-Type": {"application/json"}},
	}
	var bodies []string
	for range 2 {
		body, err := invoke(context.Background(), fn, e)
		require.NoError(t, err)
		r := decode[events.APIGatewayProxyResponse](t, body)
		require.Equal(t, http.StatusCreated, r.StatusCode)
		bodies = append(bodies, r.Body)
	}
	require.Equal(t, bodies[0], bodies[1])
	require.Equal(t, int32(1), p.charges.Load())
}
