package idemconnect_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemconnect"
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
	if info, ok := connect.CallInfoForHandlerContext(ctx); ok {
		l.keys = append(l.keys, info.RequestHeader().Values(idemconnect.KeyHeader)...)
	}
	return len(l.keys)
}

func (l *keyLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.keys...)
}

// failing answers unavailable to the first n calls, then "done".
func failing(log *keyLog, n int) handlerFunc {
	return func(ctx context.Context, _ string, _ *structpb.Struct) (proto.Message, error) {
		if c := log.add(ctx); c <= n {
			return nil, connect.NewError(connect.CodeUnavailable, errors.New("try again"))
		}
		return wrapperspb.String("done"), nil
	}
}

func withRetryInfo(code connect.Code, d time.Duration) error {
	e := connect.NewError(code, errors.New("wait"))
	detail, err := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
	if err != nil {
		panic(err)
	}
	e.AddDetail(detail)
	return e
}

func retrying(opts ...idemconnect.ClientOption) connect.ClientOption {
	return connect.WithInterceptors(idemconnect.NewClientInterceptor(opts...))
}

var fastRetries = idemconnect.WithBackoff(time.Millisecond, 5*time.Millisecond)

func TestClientSameKeyAcrossRetries(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		for _, protocol := range []struct {
			name string
			opt  connect.ClientOption
		}{{"connect", connect.WithProtoJSON()}, {"grpc", connect.WithGRPC()}} {
			var log keyLog
			s := startServer(t, b.Guard(), failing(&log, 2))
			c := newClient(t, s, retrying(fastRetries), protocol.opt)
			r := c.invoke(t.Context(), methodRefund, "", request(t, map[string]any{"amount": 1}))
			require.NoError(t, r.err, protocol.name)
			require.Equal(t, "done", r.msg.(*wrapperspb.StringValue).GetValue())
			keys := log.all()
			require.Len(t, keys, 3, protocol.name)
			require.Len(t, keys[0], 36, "a key made by idemclient.NewKey")
			require.Equal(t, []string{keys[0], keys[0], keys[0]}, keys, protocol.name)
		}
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
	c := newClient(t, s, retrying())
	req := request(t, map[string]any{"amount": 1})
	callWith := func(ctx context.Context, key string) error {
		return c.invoke(ctx, methodRefund, key, req).err
	}

	require.NoError(t, callWith(idemclient.WithKey(t.Context(), "from-context"), ""))
	require.NoError(t, callWith(idemclient.WithKey(t.Context(), "from-context"), "the call's own"))
	ctx, info := connect.NewClientContext(idemclient.WithKey(t.Context(), "from-context"))
	info.RequestHeader().Set(idemconnect.KeyHeader, "in the call info")
	require.NoError(t, callWith(ctx, ""))
	require.NoError(t, callWith(t.Context(), ""))
	require.NoError(t, callWith(t.Context(), ""))
	keys := log.all()
	require.Equal(t, []string{"from-context", "the call's own", "in the call info"}, keys[:3])
	require.Len(t, keys[3], 36)
	require.Len(t, keys[4], 36)
	require.NotEqual(t, keys[3], keys[4], "one new key per call")

	err := callWith(idemclient.WithKey(t.Context(), ""), "")
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	require.ErrorIs(t, err, idem.ErrInvalidKey)
	require.EqualValues(t, 5, runs.load(), "an invalid key is refused before the call")
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
		}, idemconnect.WithRetryDelay(20*time.Millisecond))
		plain := newClient(t, s)
		retry := newClient(t, s, retrying(idemconnect.WithMaxAttempts(100)))
		key := idemclient.NewKey()
		req := request(t, map[string]any{"amount": 1})
		aborted := b.Store.Busy(1)
		first := make(chan reply, 1)
		go func() { first <- plain.invoke(t.Context(), methodRefund, key, req) }()
		<-started
		go func() {
			<-aborted // the retrying client's first attempt is told the key is busy: it is aborted
			close(release)
		}()
		r := retry.invoke(idemclient.WithKey(t.Context(), key), methodRefund, "", req)
		require.NoError(t, r.err)
		require.Equal(t, "first", r.msg.(*wrapperspb.StringValue).GetValue())
		require.True(t, r.replayed)
		require.NoError(t, (<-first).err)
		require.EqualValues(t, 1, runs.load())
		require.Positive(t, s.errs.Load())
	})
}

func TestClientStopsRetrying(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		opts     []idemconnect.ClientOption
		timeout  time.Duration
		wantRuns int64
		wantCode connect.Code
	}{
		{"max attempts", connect.NewError(connect.CodeUnavailable, errors.New("down")), []idemconnect.ClientOption{idemconnect.WithMaxAttempts(3), fastRetries}, 0, 3, connect.CodeUnavailable},
		{"max attempts below 1", connect.NewError(connect.CodeUnavailable, errors.New("down")), []idemconnect.ClientOption{idemconnect.WithMaxAttempts(0)}, 0, 1, connect.CodeUnavailable},
		{"aborted without RetryInfo", connect.NewError(connect.CodeAborted, errors.New("conflict")), nil, 0, 1, connect.CodeAborted},
		{"not retryable", connect.NewError(connect.CodeInvalidArgument, errors.New("bad")), nil, 0, 1, connect.CodeInvalidArgument},
		{"RetryInfo past the deadline", withRetryInfo(connect.CodeAborted, 10*time.Second), nil, time.Second, 1, connect.CodeAborted},
		{"RetryInfo beyond 30s", withRetryInfo(connect.CodeUnavailable, time.Minute), nil, 0, 1, connect.CodeUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var runs counter
			s := startServer(t, nil, func(context.Context, string, *structpb.Struct) (proto.Message, error) {
				runs.inc()
				return nil, tc.err
			})
			c := newClient(t, s, retrying(tc.opts...))
			ctx := t.Context()
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			start := time.Now()
			r := c.invoke(ctx, methodRefund, "", request(t, nil))
			require.Equal(t, tc.wantCode, connect.CodeOf(r.err), "%v", r.err)
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
		return nil, withRetryInfo(connect.CodeUnavailable, 5*time.Second)
	})
	c := newClient(t, s, retrying())
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	r := c.invoke(ctx, methodRefund, "", request(t, nil))
	require.Equal(t, connect.CodeCanceled, connect.CodeOf(r.err), "%v", r.err)
	require.ErrorIs(t, r.err, context.Canceled)
	require.EqualValues(t, 1, runs.load())
}
