package idemgrpc_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemgrpc"
)

// The test service: three unary methods over well-known types, each taking
// a google.protobuf.Struct. Charge answers a Struct, Refund a StringValue and
// Ping an Empty (by the tests' handlers), so replays of several message
// types can be compared.
const (
	methodCharge = "/idemtest.Payments/Charge"
	methodRefund = "/idemtest.Payments/Refund"
	methodPing   = "/idemtest.Payments/Ping"
)

// handlerFunc is a test's implementation of every method.
type handlerFunc func(ctx context.Context, method string, req *structpb.Struct) (proto.Message, error)

type service struct{ h handlerFunc }

func unaryMethod(name string) grpc.MethodDesc {
	full := "/idemtest.Payments/" + name
	return grpc.MethodDesc{
		MethodName: name,
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(structpb.Struct)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				return srv.(*service).h(ctx, full, req.(*structpb.Struct))
			}
			if interceptor == nil {
				return h(ctx, in)
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: full}, h)
		},
	}
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: "idemtest.Payments",
	HandlerType: (*any)(nil),
	Methods:     []grpc.MethodDesc{unaryMethod("Charge"), unaryMethod("Refund"), unaryMethod("Ping")},
	Metadata:    "idemtest.proto",
}

// server is a running test server.
type server struct {
	addr string
	// types records the concrete type of each answer that left the idem
	// interceptor, in order; errs counts the errors.
	mu    sync.Mutex
	types []string
	errs  atomic.Int64
}

func (s *server) answerTypes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.types...)
}

// startServer serves h on 127.0.0.1 behind a recovery interceptor, a
// recorder and idem's interceptor (when g is not nil).
func startServer(t testing.TB, g *idem.Guard, h handlerFunc, opts ...idemgrpc.ServerOption) *server {
	t.Helper()
	s := &server{}
	recovery := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				resp, err = nil, status.Errorf(codes.Internal, "panic: %v", p)
			}
		}()
		return next(ctx, req)
	}
	recorder := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		resp, err := next(ctx, req)
		if err != nil {
			s.errs.Add(1)
			return resp, err
		}
		s.mu.Lock()
		s.types = append(s.types, fmt.Sprintf("%T", resp))
		s.mu.Unlock()
		return resp, err
	}
	chain := []grpc.UnaryServerInterceptor{recovery, recorder}
	if g != nil {
		chain = append(chain, idemgrpc.UnaryServerInterceptor(g, opts...))
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(chain...))
	srv.RegisterService(&serviceDesc, &service{h: h})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	s.addr = l.Addr().String()
	return s
}

// dial returns a client connection to s.
func dial(t testing.TB, s *server, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	conn, err := grpc.NewClient(s.addr, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// reply is the outcome of one call.
type reply struct {
	msg      proto.Message
	err      error
	replayed bool
}

// invoke calls method with key in the metadata (none when key is ""),
// decoding the answer into a new message like out.
func invoke(ctx context.Context, conn *grpc.ClientConn, method, key string, req *structpb.Struct, out proto.Message) reply {
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)
	}
	msg := out.ProtoReflect().New().Interface()
	var header, trailer metadata.MD
	err := conn.Invoke(ctx, method, req, msg, grpc.Header(&header), grpc.Trailer(&trailer))
	replayed := len(header.Get(idemgrpc.ReplayedKey)) > 0 || len(trailer.Get(idemgrpc.ReplayedKey)) > 0
	if err != nil {
		msg = nil
	}
	return reply{msg: msg, err: err, replayed: replayed}
}

// request returns a Struct with the given fields.
func request(t *testing.T, fields map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(fields)
	require.NoError(t, err)
	return s
}

// reason returns the ErrorInfo reason carried by err, or "".
func reason(err error) string {
	for _, d := range status.Convert(err).Details() {
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
