package idemgrpc_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemgrpc"
	"github.com/idemkit/idem/idemclient"
)

// keyLog records the key of every call a handler sees.
type keyLog struct {
	mu   sync.Mutex
	keys []string
}

func (l *keyLog) add(ctx context.Context) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.keys = append(l.keys, metadata.ValueFromIncomingContext(ctx, idemgrpc.MetadataKey)...)
	return len(l.keys)
}

func (l *keyLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.keys...)
}

// failing answers Unavailable to the first n calls, then the call's count.
func failing(log *keyLog, n int) handlerFunc {
	return func(ctx context.Context, _ string, _ *structpb.Struct) (proto.Message, error) {
		if c := log.add(ctx); c <= n {
			return nil, status.Error(codes.Unavailable, "try again")
		}
		return wrapperspb.String("done"), nil
	}
}

func withRetryInfo(code codes.Code, d time.Duration) error {
	st, err := status.New(code, "wait").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
	if err != nil {
		panic(err)
	}
	return st.Err()
}

var fastRetries = idemgrpc.WithBackoff(time.Millisecond, 5*time.Millisecond)

func TestClientSameKeyAcrossRetries(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		var log keyLog
		s := startServer(t, b.Guard(), failing(&log, 2))
		conn := dial(t, s, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(fastRetries)))
		out := &wrapperspb.StringValue{}
		require.NoError(t, conn.Invoke(t.Context(), methodCharge, request(t, map[string]any{"amount": 1}), out))
		require.Equal(t, "done", out.GetValue())
		keys := log.all()
		require.Len(t, keys, 3)
		require.Len(t, keys[0], 36, "a key made by idemclient.NewKey")
		require.Equal(t, []string{keys[0], keys[0], keys[0]}, keys)
	})
}

func TestClientUnderGRPCRetryPolicy(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		var log keyLog
		s := startServer(t, b.Guard(), failing(&log, 2))
		conn := dial(t, s,
			grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.WithMaxAttempts(1))),
			grpc.WithDefaultServiceConfig(`{"methodConfig": [{"name": [{"service": "idemtest.Payments"}],
				"retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.05s",
				"backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`))
		out := &wrapperspb.StringValue{}
		require.NoError(t, conn.Invoke(t.Context(), methodCharge, request(t, map[string]any{"amount": 1}), out))
		keys := log.all()
		require.Len(t, keys, 3, "gRPC's retry policy re-sent the call")
		require.Equal(t, []string{keys[0], keys[0], keys[0]}, keys)
	})
}

func TestClientKeys(t *testing.T) {
	var log keyLog
	var runs counter
	s := startServer(t, nil, func(ctx context.Context, _ string, _ *structpb.Struct) (proto.Message, error) {
		runs.inc()
		log.add(ctx)
		return wrapperspb.String("ok"), nil
	})
	conn := dial(t, s, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor()))
	req := request(t, map[string]any{"amount": 1})
	call := func(ctx context.Context) error {
		return conn.Invoke(ctx, methodCharge, req, &wrapperspb.StringValue{})
	}

	require.NoError(t, call(idemclient.WithKey(t.Context(), "from-context")))
	own := metadata.AppendToOutgoingContext(idemclient.WithKey(t.Context(), "from-context"), idemgrpc.MetadataKey, "the call's own")
	require.NoError(t, call(own))
	require.NoError(t, call(t.Context()))
	require.NoError(t, call(t.Context()))
	keys := log.all()
	require.Equal(t, []string{"from-context", "the call's own"}, keys[:2])
	require.Len(t, keys[2], 36)
	require.Len(t, keys[3], 36)
	require.NotEqual(t, keys[2], keys[3], "one new key per call")

	err := call(idemclient.WithKey(t.Context(), ""))
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.ErrorIs(t, err, idem.ErrInvalidKey)
	require.EqualValues(t, 4, runs.load(), "an invalid key is refused before the call")
}

func TestClientRetriesInProgressToFirstAnswer(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		started, release := make(chan struct{}), make(chan struct{})
		var runs counter
		s := startServer(t, b.Guard(), func(context.Context, string, *structpb.Struct) (proto.Message, error) {
			runs.inc()
			close(started)
			<-release
			return wrapperspb.String("first"), nil
		}, idemgrpc.WithRetryDelay(20*time.Millisecond))
		plain := dial(t, s)
		retrying := dial(t, s, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.WithMaxAttempts(100))))
		key := idemclient.NewKey()
		req := request(t, map[string]any{"amount": 1})
		aborted := b.Store.Busy(1)
		first := make(chan reply, 1)
		go func() { first <- invoke(t.Context(), plain, methodCharge, key, req, &wrapperspb.StringValue{}) }()
		<-started
		go func() {
			<-aborted // the retrying client's first attempt is told the key is busy: it is aborted
			close(release)
		}()
		var header metadata.MD
		out := &wrapperspb.StringValue{}
		require.NoError(t, retrying.Invoke(idemclient.WithKey(t.Context(), key), methodCharge, req, out, grpc.Header(&header)))
		require.Equal(t, "first", out.GetValue())
		require.Equal(t, []string{"true"}, header.Get(idemgrpc.ReplayedKey))
		require.NoError(t, (<-first).err)
		require.EqualValues(t, 1, runs.load())
		require.Positive(t, s.errs.Load())
	})
}

func TestClientStopsRetrying(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		opts     []idemgrpc.ClientOption
		timeout  time.Duration
		wantRuns int64
		wantCode codes.Code
	}{
		{"max attempts", status.Error(codes.Unavailable, "down"), []idemgrpc.ClientOption{idemgrpc.WithMaxAttempts(3), fastRetries}, 0, 3, codes.Unavailable},
		{"max attempts below 1", status.Error(codes.Unavailable, "down"), []idemgrpc.ClientOption{idemgrpc.WithMaxAttempts(0)}, 0, 1, codes.Unavailable},
		{"Aborted without RetryInfo", status.Error(codes.Aborted, "conflict"), nil, 0, 1, codes.Aborted},
		{"not retryable", status.Error(codes.InvalidArgument, "bad"), nil, 0, 1, codes.InvalidArgument},
		{"RetryInfo past the deadline", withRetryInfo(codes.Aborted, 10*time.Second), nil, time.Second, 1, codes.Aborted},
		{"RetryInfo beyond 30s", withRetryInfo(codes.Unavailable, time.Minute), nil, 0, 1, codes.Unavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var runs counter
			s := startServer(t, nil, func(context.Context, string, *structpb.Struct) (proto.Message, error) {
				runs.inc()
				return nil, tc.err
			})
			conn := dial(t, s, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(tc.opts...)))
			ctx := t.Context()
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			start := time.Now()
			err := conn.Invoke(ctx, methodCharge, request(t, nil), &wrapperspb.StringValue{})
			require.Equal(t, tc.wantCode, status.Code(err), "%v", err)
			require.Equal(t, tc.wantRuns, runs.load())
			// It gives up at once: before the caller's deadline where there
			// is one, and long before any RetryInfo (a minute here) would
			// end, with room for any load.
			if tc.timeout > 0 {
				require.NoError(t, ctx.Err(), "the client waited out the caller's deadline")
			} else {
				require.Less(t, time.Since(start), 10*time.Second)
			}
		})
	}
}

func TestClientContextEndsWait(t *testing.T) {
	var runs counter
	s := startServer(t, nil, func(context.Context, string, *structpb.Struct) (proto.Message, error) {
		runs.inc()
		return nil, withRetryInfo(codes.Unavailable, 5*time.Second)
	})
	conn := dial(t, s, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor()))
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	err := conn.Invoke(ctx, methodCharge, request(t, nil), &wrapperspb.StringValue{})
	require.Equal(t, codes.Canceled, status.Code(err), "%v", err)
	require.True(t, errors.Is(ctx.Err(), context.Canceled))
	require.EqualValues(t, 1, runs.load())
}
