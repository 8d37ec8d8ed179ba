package idemgrpc_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemgrpc"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idemstore"
)

func TestDuplicatesRunOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		var runs counter
		s := startServer(t, b.Guard(idem.WithWait(5*time.Second)), func(ctx context.Context, _ string, req *structpb.Struct) (proto.Message, error) {
			n := runs.inc()
			time.Sleep(50 * time.Millisecond)
			return structpb.NewStruct(map[string]any{"run": float64(n), "amount": req.Fields["amount"].GetNumberValue()})
		})
		conn := dial(t, s)
		key := idemclient.NewKey()
		req := request(t, map[string]any{"amount": 1000})
		const n = 32
		replies := make([]reply, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { replies[i] = invoke(t.Context(), conn, methodCharge, key, req, &structpb.Struct{}) })
		}
		wg.Wait()
		require.EqualValues(t, 1, runs.load())
		replayed := 0
		for _, r := range replies {
			require.NoError(t, r.err)
			require.True(t, proto.Equal(replies[0].msg, r.msg), "%v != %v", replies[0].msg, r.msg)
			if r.replayed {
				replayed++
			}
		}
		require.Equal(t, n-1, replayed)
		require.EqualValues(t, 1, replies[0].msg.(*structpb.Struct).Fields["run"].GetNumberValue())
	})
}

func TestMismatch(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		var runs counter
		s := startServer(t, b.Guard(), func(context.Context, string, *structpb.Struct) (proto.Message, error) {
			runs.inc()
			return &emptypb.Empty{}, nil
		})
		conn := dial(t, s)
		key := idemclient.NewKey()
		require.NoError(t, invoke(t.Context(), conn, methodCharge, key, request(t, map[string]any{"amount": 1, "to": "a"}), &emptypb.Empty{}).err)
		// The same fields built again: deterministic encoding, same request.
		r := invoke(t.Context(), conn, methodCharge, key, request(t, map[string]any{"to": "a", "amount": 1}), &emptypb.Empty{})
		require.NoError(t, r.err)
		require.True(t, r.replayed)

		r = invoke(t.Context(), conn, methodCharge, key, request(t, map[string]any{"amount": 2, "to": "a"}), &emptypb.Empty{})
		require.Equal(t, codes.InvalidArgument, status.Code(r.err))
		require.Equal(t, idemgrpc.ReasonKeyReused, reason(r.err))
		require.EqualValues(t, 1, runs.load())
	})
}

func TestInProgress(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		for _, tc := range []struct {
			name string
			wait time.Duration
		}{{"without wait", 0}, {"with wait", 5 * time.Second}} {
			t.Run(tc.name, func(t *testing.T) {
				started, release := make(chan struct{}), make(chan struct{})
				var runs counter
				s := startServer(t, b.Guard(idem.WithWait(tc.wait)), func(context.Context, string, *structpb.Struct) (proto.Message, error) {
					runs.inc()
					close(started)
					<-release
					return wrapperspb.String("first"), nil
				}, idemgrpc.WithRetryDelay(250*time.Millisecond))
				conn := dial(t, s)
				key := idemclient.NewKey()
				req := request(t, map[string]any{"amount": 5})
				first := make(chan reply, 1)
				go func() { first <- invoke(t.Context(), conn, methodRefund, key, req, &wrapperspb.StringValue{}) }()
				<-started

				if tc.wait == 0 {
					r := invoke(t.Context(), conn, methodRefund, key, req, &wrapperspb.StringValue{})
					close(release)
					st := status.Convert(r.err)
					require.Equal(t, codes.Aborted, st.Code(), "%v", r.err)
					require.Equal(t, idemgrpc.ReasonInProgress, reason(r.err))
					var delay time.Duration
					for _, d := range st.Details() {
						if ri, ok := d.(*errdetails.RetryInfo); ok {
							delay = ri.GetRetryDelay().AsDuration()
						}
					}
					require.Equal(t, 250*time.Millisecond, delay)
				} else {
					second := make(chan reply, 1)
					waiting := b.Store.Busy(1)
					go func() { second <- invoke(t.Context(), conn, methodRefund, key, req, &wrapperspb.StringValue{}) }()
					<-waiting // the duplicate was told to wait
					close(release)
					r := <-second
					require.NoError(t, r.err)
					require.True(t, r.replayed)
					require.Equal(t, "first", r.msg.(*wrapperspb.StringValue).GetValue())
				}
				require.NoError(t, (<-first).err)
				require.EqualValues(t, 1, runs.load())
			})
		}
	})
}

func TestStoredAndReleasedErrors(t *testing.T) {
	detail := &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "amount", Description: "too large"}}}
	withDetail := func(c codes.Code) error {
		st, err := status.New(c, c.String()+" answer").WithDetails(detail)
		if err != nil {
			panic(err)
		}
		return st.Err()
	}
	tests := []struct {
		name   string
		err    error
		stored bool
	}{
		{"InvalidArgument", withDetail(codes.InvalidArgument), true},
		{"NotFound", withDetail(codes.NotFound), true},
		{"AlreadyExists", withDetail(codes.AlreadyExists), true},
		{"PermissionDenied", withDetail(codes.PermissionDenied), true},
		{"FailedPrecondition", withDetail(codes.FailedPrecondition), true},
		{"OutOfRange", withDetail(codes.OutOfRange), true},
		{"Unimplemented", withDetail(codes.Unimplemented), true},
		{"Permanent plain error", idem.Permanent(errors.New("card declined")), true},
		{"Unavailable", withDetail(codes.Unavailable), false},
		{"DeadlineExceeded", withDetail(codes.DeadlineExceeded), false},
		{"Aborted", withDetail(codes.Aborted), false},
		{"ResourceExhausted", withDetail(codes.ResourceExhausted), false},
		{"Internal", withDetail(codes.Internal), false},
		{"Unknown", withDetail(codes.Unknown), false},
		{"plain Go error", errors.New("boom"), false},
	}
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.Guard()
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				var runs counter
				s := startServer(t, g, func(context.Context, string, *structpb.Struct) (proto.Message, error) {
					runs.inc()
					return nil, tc.err
				})
				conn := dial(t, s)
				key := idemclient.NewKey()
				req := request(t, map[string]any{"amount": 7})
				first := invoke(t.Context(), conn, methodCharge, key, req, &structpb.Struct{})
				second := invoke(t.Context(), conn, methodCharge, key, req, &structpb.Struct{})
				want := status.Convert(first.err)
				require.NotEqual(t, codes.OK, want.Code())
				got := status.Convert(second.err)
				require.Equal(t, want.Code(), got.Code())
				require.Equal(t, want.Message(), got.Message())
				require.True(t, proto.Equal(want.Proto(), got.Proto()), "%v != %v", want.Proto(), got.Proto())
				require.False(t, first.replayed)
				if tc.stored {
					require.EqualValues(t, 1, runs.load())
					require.True(t, second.replayed)
				} else {
					require.EqualValues(t, 2, runs.load())
					require.False(t, second.replayed)
				}
			})
		}
	})
}

func TestRedisStopped(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		var runs counter
		s := startServer(t, b.Guard(), func(context.Context, string, *structpb.Struct) (proto.Message, error) {
			runs.inc()
			return &emptypb.Empty{}, nil
		})
		conn := dial(t, s)
		b.Stop()
		r := invoke(t.Context(), conn, methodCharge, idemclient.NewKey(), request(t, map[string]any{"amount": 1}), &emptypb.Empty{})
		require.Equal(t, codes.Unavailable, status.Code(r.err), "%v", r.err)
		require.Equal(t, idemgrpc.ReasonStoreUnavailable, reason(r.err))
		require.Zero(t, runs.load())
	})
}

// failComplete is a store whose completions fail, as when Redis goes away
// after the handler ran.
type failComplete struct{ idemstore.Store }

func (failComplete) Complete(context.Context, string, string, []byte, time.Duration) error {
	return errors.New("connection reset")
}

func TestNotRecorded(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		var runs counter
		g := idem.New(failComplete{idem.NewRedisStore(b.Client)}, idem.WithLogger(slog.New(slog.DiscardHandler)))
		s := startServer(t, g, func(context.Context, string, *structpb.Struct) (proto.Message, error) {
			runs.inc()
			return wrapperspb.String("charged"), nil
		})
		conn := dial(t, s)
		key := idemclient.NewKey()
		req := request(t, map[string]any{"amount": 1})
		r := invoke(t.Context(), conn, methodRefund, key, req, &wrapperspb.StringValue{})
		require.NoError(t, r.err)
		require.Equal(t, "charged", r.msg.(*wrapperspb.StringValue).GetValue())
		require.False(t, r.replayed)
		// The claim stays until its lease expires: a retry is told to wait.
		r = invoke(t.Context(), conn, methodRefund, key, req, &wrapperspb.StringValue{})
		require.Equal(t, idemgrpc.ReasonInProgress, reason(r.err))
		require.EqualValues(t, 1, runs.load())
	})
}

func TestPanicReleasesKey(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		var runs counter
		s := startServer(t, b.Guard(), func(ctx context.Context, _ string, _ *structpb.Struct) (proto.Message, error) {
			if runs.inc() == 1 {
				panic("handler bug")
			}
			a, _ := idem.AttemptFrom(ctx)
			return wrapperspb.Int64(a.Fence), nil
		})
		conn := dial(t, s)
		key := idemclient.NewKey()
		req := request(t, map[string]any{"amount": 1})
		r := invoke(t.Context(), conn, methodCharge, key, req, &wrapperspb.Int64Value{})
		require.Equal(t, codes.Internal, status.Code(r.err))
		require.Contains(t, r.err.Error(), "handler bug")
		r = invoke(t.Context(), conn, methodCharge, key, req, &wrapperspb.Int64Value{})
		require.NoError(t, r.err)
		require.EqualValues(t, 2, r.msg.(*wrapperspb.Int64Value).GetValue(), "fence")
	})
}

func TestAttemptFrom(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		ids := make(chan string, 2)
		s := startServer(t, b.Guard(), func(ctx context.Context, _ string, _ *structpb.Struct) (proto.Message, error) {
			a, ok := idem.AttemptFrom(ctx)
			if !ok {
				return nil, status.Error(codes.Internal, "no attempt")
			}
			ids <- a.ID
			if a.Fence == 1 {
				if err := a.Checkpoint(ctx, "charge", []byte("ch_1")); err != nil {
					return nil, err
				}
				return nil, status.Error(codes.Unavailable, "provider timed out") // released
			}
			return wrapperspb.String(string(a.Checkpoints()["charge"])), nil
		})
		conn := dial(t, s)
		key := idemclient.NewKey()
		req := request(t, map[string]any{"amount": 1})
		r := invoke(t.Context(), conn, methodCharge, key, req, &wrapperspb.StringValue{})
		require.Equal(t, codes.Unavailable, status.Code(r.err), "%v", r.err)
		r = invoke(t.Context(), conn, methodCharge, key, req, &wrapperspb.StringValue{})
		require.NoError(t, r.err)
		require.Equal(t, "ch_1", r.msg.(*wrapperspb.StringValue).GetValue())
		first, second := <-ids, <-ids
		require.Equal(t, first, second)
		require.Len(t, first, 22)
	})
}

func TestInterceptorPanicsOnBadOptions(t *testing.T) {
	g := idem.New(nil)
	for name, opt := range map[string]idemgrpc.ServerOption{
		"nil scope":      idemgrpc.WithScope(nil),
		"nil key func":   idemgrpc.WithKeyFunc(nil),
		"no method":      idemgrpc.WithRequiredKey(),
		"not full":       idemgrpc.WithRequiredKey("Charge"),
		"no method name": idemgrpc.WithRequiredKey("/idemtest.Payments/"),
	} {
		require.Panics(t, func() { idemgrpc.UnaryServerInterceptor(g, opt) }, name)
	}
	require.Panics(t, func() { idemgrpc.UnaryServerInterceptor(nil) })
}
