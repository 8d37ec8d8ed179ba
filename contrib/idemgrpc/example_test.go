package idemgrpc_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemgrpc"
	"github.com/idemkit/idem/idemclient"
)

// chargeFunc implements the payments service below.
type chargeFunc func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error)

// paymentsDesc is what protoc-gen-go-grpc would generate for
//
//	service Payments { rpc Charge(google.protobuf.Struct) returns (google.protobuf.Struct); }
var paymentsDesc = grpc.ServiceDesc{
	ServiceName: "payments.Payments",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Charge",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(structpb.Struct)
			if err := dec(in); err != nil {
				return nil, err
			}
			handler := func(ctx context.Context, req any) (any, error) {
				return srv.(chargeFunc)(ctx, req.(*structpb.Struct))
			}
			if interceptor == nil {
				return handler(ctx, in)
			}
			info := &grpc.UnaryServerInfo{Server: srv, FullMethod: "/payments.Payments/Charge"}
			return interceptor(ctx, in, info, handler)
		},
	}},
}

func ExampleUnaryServerInterceptor() {
	mr := miniredis.NewMiniRedis() // an embedded Redis for the example; use yours in production
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := idem.New(idem.NewRedisStore(rdb), idem.WithWait(5*time.Second))

	// The server: the payment provider is charged once per key.
	charges := 0
	var charge chargeFunc = func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		a, _ := idem.AttemptFrom(ctx) // a.ID: the payment provider's idempotency key
		charges++
		return structpb.NewStruct(map[string]any{
			"receipt": fmt.Sprintf("rc_%d", charges),
			"amount":  req.Fields["amount"].GetNumberValue(),
			"fence":   a.Fence,
		})
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(idemgrpc.UnaryServerInterceptor(g)))
	srv.RegisterService(&paymentsDesc, charge)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()

	// The client: one key per payment, sent on every retry.
	conn, err := grpc.NewClient(l.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ctx := idemclient.WithKey(context.Background(), "8e03978e-40d5-43e8-bc93-6894a57f9324")

	for _, amount := range []float64{1000, 1000, 5000} {
		req, _ := structpb.NewStruct(map[string]any{"amount": amount})
		resp := new(structpb.Struct)
		var header metadata.MD
		if err := conn.Invoke(ctx, "/payments.Payments/Charge", req, resp, grpc.Header(&header)); err != nil {
			st := status.Convert(err)
			info := st.Details()[0].(*errdetails.ErrorInfo)
			fmt.Println(st.Code(), info.GetReason())
			continue
		}
		f := resp.GetFields()
		fmt.Printf("%s amount=%v fence=%v replayed=%v\n", f["receipt"].GetStringValue(),
			f["amount"].GetNumberValue(), f["fence"].GetNumberValue(), header.Get(idemgrpc.ReplayedKey))
	}
	fmt.Println("charges:", charges)
	// Output:
	// rc_1 amount=1000 fence=1 replayed=[]
	// rc_1 amount=1000 fence=1 replayed=[true]
	// InvalidArgument IDEMPOTENCY_KEY_REUSED
	// charges: 1
}
