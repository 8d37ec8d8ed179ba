// Command payments charges a card over gRPC once, although the call is sent
// again: a payments service behind idemgrpc's server interceptor, and a
// client behind its client interceptor, on an embedded Redis (miniredis), so
// nothing needs to be installed:
//
//	go -C contrib/idemgrpc run ./examples/payments
//
// It plays four calls and prints what the client sends, what the server
// does and what the client gets: a first charge; the same call again, as a
// client sends it after its deadline expired (the stored answer, marked
// idempotent-replayed: true); the same key with another amount (refused with
// InvalidArgument); and a new payment whose answer is lost on the way, which
// the client interceptor retries with the same key.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemgrpc"
	"github.com/idemkit/idem/idemclient"
)

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "payments:", err)
		os.Exit(1)
	}
}

const methodCharge = "/payments.Payments/Charge"

// paymentsDesc is what protoc-gen-go-grpc would generate for
//
//	service Payments { rpc Charge(google.protobuf.Struct) returns (google.protobuf.Struct); }
//
// with a *provider as its implementation.
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
				return srv.(*provider).Charge(ctx, req.(*structpb.Struct))
			}
			if interceptor == nil {
				return handler(ctx, in)
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: methodCharge}, handler)
		},
	}},
}

// provider is the payments service: each call of Charge charges the card
// at a (fake) payment provider.
type provider struct {
	log     io.Writer
	charges atomic.Int64
}

// Charge charges the amount of req ({"amount": cents, "currency": "EUR"})
// and answers the receipt.
func (p *provider) Charge(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
	amount := req.GetFields()["amount"].GetNumberValue()
	currency := req.GetFields()["currency"].GetStringValue()
	if amount <= 0 || currency == "" {
		return nil, status.Error(codes.InvalidArgument, "amount and currency are required")
	}
	// The Attempt's ID is the same in every attempt of the operation: it is
	// the idempotency key to give the provider, so that it charges once too.
	a, _ := idem.AttemptFrom(ctx)
	receipt := fmt.Sprintf("rc_%04d", p.charges.Add(1))
	fmt.Fprintf(p.log, "   server: charging %s at the provider (operation %s, attempt %d): %s\n",
		money(amount, currency), a.ID, a.Fence, receipt)
	return structpb.NewStruct(map[string]any{"receipt": receipt, "amount": amount, "currency": currency})
}

// lossyNetwork is a client interceptor standing for the network: it shows
// each call's key, and loses the answer of one call once armed (the server
// ran the call; the client gets Unavailable).
type lossyNetwork struct {
	log  io.Writer
	lose atomic.Bool
}

func (n *lossyNetwork) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	key := strings.Join(metadata.ValueFromOutgoingContext(ctx, idemgrpc.MetadataKey), ",")
	fmt.Fprintf(n.log, "   client: sending %s, %s: %s\n", method, idemgrpc.MetadataKey, key)
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err == nil && n.lose.CompareAndSwap(true, false) {
		fmt.Fprintln(n.log, "   network: the answer is lost on the way")
		return status.Error(codes.Unavailable, "connection reset (simulated)")
	}
	return err
}

// run plays the calls, writing what happens to w.
func run(w io.Writer) error {
	// The server and the client write from their own goroutines.
	w = &syncWriter{w: w}

	mr, err := miniredis.Run() // an embedded Redis for the example; use yours in production
	if err != nil {
		return err
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := idem.New(idem.NewRedisStore(rdb), idem.WithWait(5*time.Second))

	// The server: Charge requires a key, and runs once per key.
	p := &provider{log: w}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		idemgrpc.UnaryServerInterceptor(g, idemgrpc.WithRequiredKey(methodCharge))))
	srv.RegisterService(&paymentsDesc, p)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	defer func() { srv.Stop(); <-served }()

	// The client: idem's interceptor sends the key and retries with it; the
	// lossy network sits below it.
	network := &lossyNetwork{log: w}
	conn, err := grpc.NewClient(l.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(
			idemgrpc.UnaryClientInterceptor(idemgrpc.WithBackoff(10*time.Millisecond, 100*time.Millisecond)),
			network.intercept))
	if err != nil {
		return err
	}
	defer conn.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	charge := func(ctx context.Context, cents float64) error {
		req, err := structpb.NewStruct(map[string]any{"amount": cents, "currency": "EUR"})
		if err != nil {
			return err
		}
		resp := new(structpb.Struct)
		var header metadata.MD
		if err := conn.Invoke(ctx, methodCharge, req, resp, grpc.Header(&header)); err != nil {
			st, ok := status.FromError(err)
			if !ok {
				return err
			}
			fmt.Fprintf(w, "   client: %s %s: %s\n", st.Code(), reason(st), st.Message())
			return nil
		}
		replayed := "a first answer"
		if v := header.Get(idemgrpc.ReplayedKey); len(v) > 0 {
			replayed = idemgrpc.ReplayedKey + ": " + strings.Join(v, ",")
		}
		f := resp.GetFields()
		fmt.Fprintf(w, "   client: receipt %s for %s, %s\n", f["receipt"].GetStringValue(),
			money(f["amount"].GetNumberValue(), f["currency"].GetStringValue()), replayed)
		return nil
	}

	// One key per payment, made by the client and kept for its retries.
	payment := idemclient.WithKey(ctx, idemclient.NewKey())
	steps := []struct {
		title  string
		ctx    context.Context
		amount float64
		lose   bool
	}{
		{"1. Charge 10.00 EUR, with a new key set by idemclient.WithKey.", payment, 1000, false},
		{"2. The same call again, as a client sends it when its deadline expired: same key, same request.", payment, 1000, false},
		{"3. The same key with another amount: another request, refused; the card is not charged.", payment, 5000, false},
		{"4. A new payment without idemclient.WithKey: the interceptor makes a key. The answer is lost; the interceptor retries with the same key.", ctx, 2500, true},
	}
	for _, s := range steps {
		fmt.Fprintln(w, s.title)
		network.lose.Store(s.lose)
		if err := charge(s.ctx, s.amount); err != nil {
			return err
		}
	}
	n := p.charges.Load()
	fmt.Fprintf(w, "The provider charged %d times for 2 payments.\n", n)
	if n != 2 {
		return errors.New("a payment was charged twice")
	}
	return nil
}

// money formats an amount in cents.
func money(cents float64, currency string) string {
	return fmt.Sprintf("%.2f %s", cents/100, currency)
}

// reason returns the errdetails.ErrorInfo reason st carries, or "".
func reason(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// syncWriter serialises writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}
