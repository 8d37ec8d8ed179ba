package idemconnect_test

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkit/idem/contrib/idemconnect"
	"github.com/idemkit/idem/idemclient"
)

func TestRequiredAndOptionalKeys(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		var runs counter
		s := startServer(t, b.Guard(), func(context.Context, string, *structpb.Struct) (proto.Message, error) {
			runs.inc()
			return &emptypb.Empty{}, nil
		}, idemconnect.WithRequiredKey(methodRefund, methodList))
		c := newClient(t, s)
		req := request(t, map[string]any{"amount": 1})

		r := c.invoke(t.Context(), methodRefund, "", req)
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(r.err))
		require.Equal(t, idemconnect.ReasonKeyMissing, reason(r.err))
		require.Zero(t, runs.load())

		for range 2 { // optional: passed through, run every time
			r = c.invoke(t.Context(), methodPing, "", req)
			require.NoError(t, r.err)
			require.False(t, r.replayed)
		}
		require.EqualValues(t, 2, runs.load())

		// Streams pass through untouched, even when required, key or not.
		for _, key := range []string{"", "k-1", "k-1"} {
			r := connect.NewRequest(req)
			if key != "" {
				r.Header().Set(idemconnect.KeyHeader, key)
			}
			st, err := c.list.CallServerStream(t.Context(), r)
			require.NoError(t, err)
			n := 0
			for st.Receive() {
				n++
			}
			require.NoError(t, st.Err())
			require.Equal(t, 2, n)
			require.Empty(t, st.ResponseHeader().Get(idemconnect.ReplayedHeader))
		}
		require.EqualValues(t, 3, s.streams.Load())

		keys, err := b.Client.Keys(t.Context(), "*").Result()
		require.NoError(t, err)
		require.Empty(t, keys, "a call without a key, or a stream, touched Redis")
	})
}

func TestInvalidKeys(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		var runs counter
		s := startServer(t, b.Guard(), func(context.Context, string, *structpb.Struct) (proto.Message, error) {
			runs.inc()
			return &emptypb.Empty{}, nil
		})
		c := newClient(t, s)
		req := request(t, map[string]any{"amount": 1})
		for _, tc := range []struct {
			name   string
			values []string
		}{
			{"256 bytes", []string{strings.Repeat("k", 256)}},
			{"empty", []string{""}},
			{"empty quoted", []string{`""`}},
			{"unterminated quote", []string{`"abc`}},
			{"sent twice", []string{"a", "b"}},
		} {
			r := connect.NewRequest(req)
			for _, v := range tc.values {
				r.Header().Add(idemconnect.KeyHeader, v)
			}
			_, err := c.ping.CallUnary(t.Context(), r)
			require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), tc.name)
			require.Equal(t, idemconnect.ReasonKeyInvalid, reason(err), tc.name)
		}
		require.Zero(t, runs.load())

		long := strings.Repeat("k", 255) // the longest key; the operation key is hashed
		require.NoError(t, c.invoke(t.Context(), methodPing, long, req).err)
		require.True(t, c.invoke(t.Context(), methodPing, long, req).replayed)
		// A quoted key is the same key, as in the HTTP middleware.
		require.NoError(t, c.invoke(t.Context(), methodPing, "k-1", req).err)
		require.True(t, c.invoke(t.Context(), methodPing, `"k-1"`, req).replayed)
		require.EqualValues(t, 2, runs.load())
	})
}

func TestTwoTenants(t *testing.T) {
	tenantOf := func(ctx context.Context) string {
		info, ok := connect.CallInfoForHandlerContext(ctx) // an authentication interceptor's job
		if !ok {
			return ""
		}
		return info.RequestHeader().Get("Tenant")
	}
	forEachBackend(t, func(t *testing.T, b *backend) {
		var runs counter
		s := startServer(t, b.Guard(), func(ctx context.Context, _ string, _ *structpb.Struct) (proto.Message, error) {
			runs.inc()
			return wrapperspb.String("for " + tenantOf(ctx)), nil
		}, idemconnect.WithScope(tenantOf))
		c := newClient(t, s)
		key := idemclient.NewKey()
		req := request(t, map[string]any{"amount": 1})
		as := func(tenant string) reply {
			r := connect.NewRequest(req)
			r.Header().Set(idemconnect.KeyHeader, key)
			if tenant != "" {
				r.Header().Set("Tenant", tenant)
			}
			resp, err := c.refund.CallUnary(t.Context(), r)
			if err != nil {
				return reply{err: err}
			}
			return reply{msg: resp.Msg, replayed: resp.Header().Get(idemconnect.ReplayedHeader) == "true"}
		}
		for _, tenant := range []string{"a", "b"} {
			r := as(tenant)
			require.NoError(t, r.err)
			require.False(t, r.replayed)
			require.Equal(t, "for "+tenant, r.msg.(*wrapperspb.StringValue).GetValue())
		}
		r := as("a")
		require.True(t, r.replayed)
		require.Equal(t, "for a", r.msg.(*wrapperspb.StringValue).GetValue())

		r = as("")
		require.Equal(t, connect.CodeInternal, connect.CodeOf(r.err))
		require.Equal(t, idemconnect.ReasonScopeMissing, reason(r.err))
		require.EqualValues(t, 2, runs.load())
	})
}

func TestReplayKeepsType(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		s := startServer(t, b.Guard(), func(_ context.Context, method string, _ *structpb.Struct) (proto.Message, error) {
			switch method {
			case methodCharge:
				return structpb.NewStruct(map[string]any{"id": "ch_1", "amount": 1000, "tags": []any{"a", true}})
			case methodRefund:
				return wrapperspb.String("re_1"), nil
			}
			return &emptypb.Empty{}, nil
		})
		req := request(t, map[string]any{"amount": 1000})
		for _, protocol := range []struct {
			name string
			opts []connect.ClientOption
		}{{"connect", nil}, {"grpc", []connect.ClientOption{connect.WithGRPC()}}, {"grpc-web", []connect.ClientOption{connect.WithGRPCWeb()}}} {
			c := newClient(t, s, protocol.opts...)
			for _, tc := range []struct{ method, typ string }{
				{methodCharge, "google.protobuf.Struct"},
				{methodRefund, "google.protobuf.StringValue"},
				{methodPing, "google.protobuf.Empty"},
			} {
				before := len(s.answerTypes())
				key := idemclient.NewKey()
				first := c.invoke(t.Context(), tc.method, key, req)
				second := c.invoke(t.Context(), tc.method, key, req)
				require.NoError(t, first.err, protocol.name)
				require.NoError(t, second.err, protocol.name)
				require.True(t, second.replayed, protocol.name)
				require.True(t, proto.Equal(first.msg, second.msg), protocol.name)
				require.Equal(t, []string{tc.typ, tc.typ}, s.answerTypes()[before:], protocol.name)
			}
		}
	})
}

func TestKeyFuncAIP155(t *testing.T) {
	requestID := func(_ context.Context, req any) (string, bool) {
		id := req.(*structpb.Struct).GetFields()["request_id"].GetStringValue()
		return id, id != ""
	}
	forEachBackend(t, func(t *testing.T, b *backend) {
		var runs counter
		s := startServer(t, b.Guard(), func(context.Context, string, *structpb.Struct) (proto.Message, error) {
			return wrapperspb.String(strings.Repeat("x", int(runs.inc()))), nil
		}, idemconnect.WithKeyFunc(requestID))
		c := newClient(t, s)
		req := request(t, map[string]any{"amount": 1, "request_id": idemclient.NewKey()})
		first := c.invoke(t.Context(), methodRefund, "", req)
		// The field wins over the header.
		second := c.invoke(t.Context(), methodRefund, idemclient.NewKey(), req)
		require.NoError(t, first.err)
		require.True(t, second.replayed)
		require.True(t, proto.Equal(first.msg, second.msg))

		// No request_id: the header's key.
		plain := request(t, map[string]any{"amount": 1})
		key := idemclient.NewKey()
		require.False(t, c.invoke(t.Context(), methodRefund, key, plain).replayed)
		require.True(t, c.invoke(t.Context(), methodRefund, key, plain).replayed)
		require.EqualValues(t, 2, runs.load())

		tooLong := request(t, map[string]any{"request_id": strings.Repeat("r", 256)})
		r := c.invoke(t.Context(), methodRefund, "", tooLong)
		require.Equal(t, idemconnect.ReasonKeyInvalid, reason(r.err))
	})
}

func TestSameKeyOtherMethodRuns(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		var runs counter
		s := startServer(t, b.Guard(), func(_ context.Context, method string, _ *structpb.Struct) (proto.Message, error) {
			runs.inc()
			if method == methodPing {
				return &emptypb.Empty{}, nil
			}
			return wrapperspb.String(method), nil
		})
		c := newClient(t, s)
		key := idemclient.NewKey()
		req := request(t, map[string]any{"amount": 1})
		for _, m := range []string{methodRefund, methodPing, methodRefund, methodPing} {
			r := c.invoke(t.Context(), m, key, req)
			require.NoError(t, r.err)
			if m == methodRefund {
				require.Equal(t, m, r.msg.(*wrapperspb.StringValue).GetValue())
			}
		}
		require.EqualValues(t, 2, runs.load())
	})
}
