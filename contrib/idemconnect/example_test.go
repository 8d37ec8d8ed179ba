package idemconnect_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"connectrpc.com/connect"
	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemconnect"
	"github.com/idemkit/idem/idemclient"
)

func ExampleNewServerInterceptor() {
	mr := miniredis.NewMiniRedis() // an embedded Redis for the example; use yours in production
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := idem.New(idem.NewRedisStore(rdb), idem.WithWait(5*time.Second))

	// The server: the payment provider is charged once per key. Generated
	// code (protoc-gen-connect-go) would name the procedure and the types.
	const procedure = "/payments.Payments/Charge"
	charges := 0
	charge := func(ctx context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		a, _ := idem.AttemptFrom(ctx) // a.ID: the payment provider's idempotency key
		charges++
		receipt, err := structpb.NewStruct(map[string]any{
			"receipt": fmt.Sprintf("rc_%d", charges),
			"amount":  req.Msg.Fields["amount"].GetNumberValue(),
			"fence":   a.Fence,
		})
		return connect.NewResponse(receipt), err
	}
	mux := http.NewServeMux()
	mux.Handle(procedure, connect.NewUnaryHandler(procedure, charge,
		connect.WithInterceptors(idemconnect.NewServerInterceptor(g))))
	srv := httptest.NewServer(mux) // on 127.0.0.1
	defer srv.Close()

	// The client: one key per payment, sent on every retry.
	client := connect.NewClient[structpb.Struct, structpb.Struct](srv.Client(), srv.URL+procedure,
		connect.WithInterceptors(idemconnect.NewClientInterceptor()))
	ctx := idemclient.WithKey(context.Background(), "8e03978e-40d5-43e8-bc93-6894a57f9324")

	for _, amount := range []float64{1000, 1000, 5000} {
		req, _ := structpb.NewStruct(map[string]any{"amount": amount})
		resp, err := client.CallUnary(ctx, connect.NewRequest(req))
		if err != nil {
			var ce *connect.Error
			if errors.As(err, &ce) {
				info, _ := ce.Details()[0].Value()
				fmt.Println(ce.Code(), info.(*errdetails.ErrorInfo).GetReason())
			}
			continue
		}
		f := resp.Msg.GetFields()
		fmt.Printf("%s amount=%v fence=%v replayed=%q\n", f["receipt"].GetStringValue(),
			f["amount"].GetNumberValue(), f["fence"].GetNumberValue(), resp.Header().Get(idemconnect.ReplayedHeader))
	}
	fmt.Println("charges:", charges)
	// Output:
	// rc_1 amount=1000 fence=1 replayed=""
	// rc_1 amount=1000 fence=1 replayed="true"
	// invalid_argument IDEMPOTENCY_KEY_REUSED
	// charges: 1
}
