package idemconnect_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemconnect"
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
		c := newClient(t, s)
		key := idemclient.NewKey()
		req := request(t, map[string]any{"amount": 1000})
		const n = 32
		replies := make([]reply, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { replies[i] = c.invoke(t.Context(), methodCharge, key, req) })
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
		c := newClient(t, s)
		key := idemclient.NewKey()
		require.NoError(t, c.invoke(t.Context(), methodPing, key, request(t, map[string]any{"amount": 1, "to": "a"})).err)
		// The same fields built again: deterministic encoding, same request.
		r := c.invoke(t.Context(), methodPing, key, request(t, map[string]any{"to": "a", "amount": 1}))
		require.NoError(t, r.err)
		require.True(t, r.replayed)

		r = c.invoke(t.Context(), methodPing, key, request(t, map[string]any{"amount": 2, "to": "a"}))
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(r.err))
		require.Equal(t, idemconnect.ReasonKeyReused, reason(r.err))
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
				}, idemconnect.WithRetryDelay(250*time.Millisecond))
				c := newClient(t, s)
				key := idemclient.NewKey()
				req := request(t, map[string]any{"amount": 5})
				first := make(chan reply, 1)
				go func() { first <- c.invoke(t.Context(), methodRefund, key, req) }()
				<-started

				if tc.wait == 0 {
					r := c.invoke(t.Context(), methodRefund, key, req)
					close(release)
					require.Equal(t, connect.CodeAborted, connect.CodeOf(r.err), "%v", r.err)
					require.Equal(t, idemconnect.ReasonInProgress, reason(r.err))
					var delay time.Duration
					for _, d := range details(r.err) {
						if ri, ok := d.(*errdetails.RetryInfo); ok {
							delay = ri.GetRetryDelay().AsDuration()
						}
					}
					require.Equal(t, 250*time.Millisecond, delay)
				} else {
					second := make(chan reply, 1)
					waiting := b.Store.Busy(1)
					go func() { second <- c.invoke(t.Context(), methodRefund, key, req) }()
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
	detail, err := connect.NewErrorDetail(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "amount", Description: "too large"}}})
	require.NoError(t, err)
	withDetail := func(c connect.Code) error {
		e := connect.NewError(c, errors.New(c.String()+" answer"))
		e.AddDetail(detail)
		return e
	}
	tests := []struct {
		name   string
		err    error
		stored bool
	}{
		{"InvalidArgument", withDetail(connect.CodeInvalidArgument), true},
		{"NotFound", withDetail(connect.CodeNotFound), true},
		{"AlreadyExists", withDetail(connect.CodeAlreadyExists), true},
		{"PermissionDenied", withDetail(connect.CodePermissionDenied), true},
		{"FailedPrecondition", withDetail(connect.CodeFailedPrecondition), true},
		{"OutOfRange", withDetail(connect.CodeOutOfRange), true},
		{"Unimplemented", withDetail(connect.CodeUnimplemented), true},
		{"Permanent plain error", idem.Permanent(errors.New("card declined")), true},
		{"Unavailable", withDetail(connect.CodeUnavailable), false},
		{"DeadlineExceeded", withDetail(connect.CodeDeadlineExceeded), false},
		{"Aborted", withDetail(connect.CodeAborted), false},
		{"ResourceExhausted", withDetail(connect.CodeResourceExhausted), false},
		{"Internal", withDetail(connect.CodeInternal), false},
		{"Unknown", withDetail(connect.CodeUnknown), false},
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
				c := newClient(t, s)
				key := idemclient.NewKey()
				req := request(t, map[string]any{"amount": 7})
				first := c.invoke(t.Context(), methodCharge, key, req)
				second := c.invoke(t.Context(), methodCharge, key, req)
				var want, got *connect.Error
				require.ErrorAs(t, first.err, &want)
				require.ErrorAs(t, second.err, &got)
				require.Equal(t, want.Code(), got.Code())
				require.Equal(t, want.Message(), got.Message())
				require.Len(t, got.Details(), len(want.Details()))
				for i, d := range want.Details() {
					require.Equal(t, d.Type(), got.Details()[i].Type())
					require.Equal(t, d.Bytes(), got.Details()[i].Bytes())
				}
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
		c := newClient(t, s)
		b.Stop()
		r := c.invoke(t.Context(), methodPing, idemclient.NewKey(), request(t, map[string]any{"amount": 1}))
		require.Equal(t, connect.CodeUnavailable, connect.CodeOf(r.err), "%v", r.err)
		require.Equal(t, idemconnect.ReasonStoreUnavailable, reason(r.err))
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
		c := newClient(t, s)
		key := idemclient.NewKey()
		req := request(t, map[string]any{"amount": 1})
		r := c.invoke(t.Context(), methodRefund, key, req)
		require.NoError(t, r.err)
		require.Equal(t, "charged", r.msg.(*wrapperspb.StringValue).GetValue())
		require.False(t, r.replayed)
		// The claim stays until its lease expires: a retry is told to wait.
		r = c.invoke(t.Context(), methodRefund, key, req)
		require.Equal(t, idemconnect.ReasonInProgress, reason(r.err))
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
			return wrapperspb.String(string(rune('0' + a.Fence))), nil
		})
		c := newClient(t, s)
		key := idemclient.NewKey()
		req := request(t, map[string]any{"amount": 1})
		r := c.invoke(t.Context(), methodRefund, key, req)
		require.Equal(t, connect.CodeInternal, connect.CodeOf(r.err))
		require.Contains(t, r.err.Error(), "handler bug")
		r = c.invoke(t.Context(), methodRefund, key, req)
		require.NoError(t, r.err)
		require.Equal(t, "2", r.msg.(*wrapperspb.StringValue).GetValue(), "fence")
	})
}

func TestAttemptFrom(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		ids := make(chan string, 2)
		s := startServer(t, b.Guard(), func(ctx context.Context, _ string, _ *structpb.Struct) (proto.Message, error) {
			a, ok := idem.AttemptFrom(ctx)
			if !ok {
				return nil, connect.NewError(connect.CodeInternal, errors.New("no attempt"))
			}
			ids <- a.ID
			if a.Fence == 1 {
				if err := a.Checkpoint(ctx, "charge", []byte("ch_1")); err != nil {
					return nil, err
				}
				return nil, connect.NewError(connect.CodeUnavailable, errors.New("provider timed out")) // released
			}
			return wrapperspb.String(string(a.Checkpoints()["charge"])), nil
		})
		c := newClient(t, s)
		key := idemclient.NewKey()
		req := request(t, map[string]any{"amount": 1})
		r := c.invoke(t.Context(), methodRefund, key, req)
		require.Equal(t, connect.CodeUnavailable, connect.CodeOf(r.err), "%v", r.err)
		r = c.invoke(t.Context(), methodRefund, key, req)
		require.NoError(t, r.err)
		require.Equal(t, "ch_1", r.msg.(*wrapperspb.StringValue).GetValue())
		first, second := <-ids, <-ids
		require.Equal(t, first, second)
		require.Len(t, first, 22)
	})
}

func TestInterceptorPanicsOnBadOptions(t *testing.T) {
	g := idem.New(nil)
	for name, opt := range map[string]idemconnect.ServerOption{
		"nil scope":      idemconnect.WithScope(nil),
		"nil key func":   idemconnect.WithKeyFunc(nil),
		"no procedure":   idemconnect.WithRequiredKey(),
		"not procedure":  idemconnect.WithRequiredKey("Charge"),
		"no method name": idemconnect.WithRequiredKey("/idemtest.Payments/"),
	} {
		require.Panics(t, func() { idemconnect.NewServerInterceptor(g, opt) }, name)
	}
	require.Panics(t, func() { idemconnect.NewServerInterceptor(nil) })
}
