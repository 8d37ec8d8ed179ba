package idemconnect_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemconnect"
)

// The test service: three unary procedures over well-known types, each
// taking a google.protobuf.Struct. Charge answers a Struct, Refund a
// StringValue and Ping an Empty, so replays of several message types can be
// compared.
const (
	methodCharge = "/idemtest.Payments/Charge"
	methodRefund = "/idemtest.Payments/Refund"
	methodPing   = "/idemtest.Payments/Ping"
	// methodList is a server stream of two StringValues, counted in
	// server.streams.
	methodList = "/idemtest.Payments/List"
)

// handlerFunc is a test's implementation of every procedure.
type handlerFunc func(ctx context.Context, method string, req *structpb.Struct) (proto.Message, error)

// unary returns the Connect handler of one procedure, answering Res.
func unary[Res any](procedure string, h handlerFunc, opts ...connect.HandlerOption) (string, http.Handler) {
	return procedure, connect.NewUnaryHandler(procedure, func(ctx context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[Res], error) {
		m, err := h(ctx, procedure, req.Msg)
		if err != nil {
			return nil, err
		}
		res, ok := any(m).(*Res)
		if !ok {
			return nil, fmt.Errorf("handler answered %T for %s", m, procedure)
		}
		return connect.NewResponse(res), nil
	}, opts...)
}

// server is a running test server.
type server struct {
	url string
	// types records the full name of each answer that left the idem
	// interceptor, in order; errs counts the errors.
	mu      sync.Mutex
	types   []string
	errs    atomic.Int64
	streams atomic.Int64
}

func (s *server) answerTypes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.types...)
}

// startServer serves h on 127.0.0.1 (HTTP/1.1 and unencrypted HTTP/2)
// behind connect.WithRecover, a recorder and idem's interceptor (when g is
// not nil).
func startServer(t testing.TB, g *idem.Guard, h handlerFunc, opts ...idemconnect.ServerOption) *server {
	t.Helper()
	s := &server{}
	recorder := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			resp, err := next(ctx, req)
			if err != nil {
				s.errs.Add(1)
				return resp, err
			}
			s.mu.Lock()
			s.types = append(s.types, string(resp.Any().(proto.Message).ProtoReflect().Descriptor().FullName()))
			s.mu.Unlock()
			return resp, err
		}
	})
	interceptors := []connect.Interceptor{recorder}
	if g != nil {
		interceptors = append(interceptors, idemconnect.NewServerInterceptor(g, opts...))
	}
	hopts := []connect.HandlerOption{
		connect.WithInterceptors(interceptors...),
		connect.WithRecover(func(_ context.Context, _ connect.Spec, _ http.Header, p any) error {
			return connect.NewError(connect.CodeInternal, fmt.Errorf("panic: %v", p))
		}),
	}
	mux := http.NewServeMux()
	mux.Handle(unary[structpb.Struct](methodCharge, h, hopts...))
	mux.Handle(unary[wrapperspb.StringValue](methodRefund, h, hopts...))
	mux.Handle(unary[emptypb.Empty](methodPing, h, hopts...))
	mux.Handle(methodList, connect.NewServerStreamHandler(methodList, func(_ context.Context, _ *connect.Request[structpb.Struct], st *connect.ServerStream[wrapperspb.StringValue]) error {
		s.streams.Add(1)
		for _, v := range []string{"a", "b"} {
			if err := st.Send(wrapperspb.String(v)); err != nil {
				return err
			}
		}
		return nil
	}, hopts...))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: mux, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	s.url = "http://" + l.Addr().String()
	return s
}

// client calls the test service.
type client struct {
	charge *connect.Client[structpb.Struct, structpb.Struct]
	refund *connect.Client[structpb.Struct, wrapperspb.StringValue]
	ping   *connect.Client[structpb.Struct, emptypb.Empty]
	list   *connect.Client[structpb.Struct, wrapperspb.StringValue]
}

// newClient returns a client of s over HTTP/2 without TLS (which the gRPC
// protocol needs), with opts.
func newClient(t testing.TB, s *server, opts ...connect.ClientOption) *client {
	t.Helper()
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}
	return &client{
		charge: connect.NewClient[structpb.Struct, structpb.Struct](hc, s.url+methodCharge, opts...),
		refund: connect.NewClient[structpb.Struct, wrapperspb.StringValue](hc, s.url+methodRefund, opts...),
		ping:   connect.NewClient[structpb.Struct, emptypb.Empty](hc, s.url+methodPing, opts...),
		list:   connect.NewClient[structpb.Struct, wrapperspb.StringValue](hc, s.url+methodList, opts...),
	}
}

// reply is the outcome of one call.
type reply struct {
	msg      proto.Message
	err      error
	replayed bool
}

func call[Res any](ctx context.Context, c *connect.Client[structpb.Struct, Res], key string, req *structpb.Struct) reply {
	r := connect.NewRequest(req)
	if key != "" {
		r.Header().Set(idemconnect.KeyHeader, key)
	}
	resp, err := c.CallUnary(ctx, r)
	if err != nil {
		var ce *connect.Error
		replayed := errors.As(err, &ce) && ce.Meta().Get(idemconnect.ReplayedHeader) == "true"
		return reply{err: err, replayed: replayed}
	}
	return reply{msg: any(resp.Msg).(proto.Message), replayed: resp.Header().Get(idemconnect.ReplayedHeader) == "true"}
}

// invoke calls method with key in the header (none when key is "").
func (c *client) invoke(ctx context.Context, method, key string, req *structpb.Struct) reply {
	switch method {
	case methodCharge:
		return call(ctx, c.charge, key, req)
	case methodRefund:
		return call(ctx, c.refund, key, req)
	}
	return call(ctx, c.ping, key, req)
}

// request returns a Struct with the given fields.
func request(t testing.TB, fields map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(fields)
	require.NoError(t, err)
	return s
}

// details returns the details carried by err.
func details(err error) []proto.Message {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	var out []proto.Message
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			out = append(out, v)
		}
	}
	return out
}

// reason returns the ErrorInfo reason carried by err, or "".
func reason(err error) string {
	for _, d := range details(err) {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// counter counts handler runs.
type counter struct{ n atomic.Int64 }

func (c *counter) inc() int64  { return c.n.Add(1) }
func (c *counter) load() int64 { return c.n.Load() }
