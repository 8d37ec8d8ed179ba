package idemgrpc_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkit/idem/contrib/idemgrpc"
	"github.com/idemkit/idem/idemclient"
)

func TestRequiredAndOptionalKeys(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		var runs counter
		s := startServer(t, b.Guard(), func(context.Context, string, *structpb.Struct) (proto.Message, error) {
			runs.inc()
			return &emptypb.Empty{}, nil
		}, idemgrpc.WithRequiredKey(methodCharge))
		conn := dial(t, s)
		req := request(t, map[string]any{"amount": 1})

		r := invoke(t.Context(), conn, methodCharge, "", req, &emptypb.Empty{})
		require.Equal(t, codes.InvalidArgument, status.Code(r.err))
		require.Equal(t, idemgrpc.ReasonKeyMissing, reason(r.err))
		require.Zero(t, runs.load())

		for range 2 { // optional: passed through, run every time
			r = invoke(t.Context(), conn, methodRefund, "", req, &emptypb.Empty{})
			require.NoError(t, r.err)
			require.False(t, r.replayed)
		}
		require.EqualValues(t, 2, runs.load())
		keys, err := b.Client.Keys(t.Context(), "*").Result()
		require.NoError(t, err)
		require.Empty(t, keys, "a call without a key touched Redis")
	})
}

func TestInvalidKeys(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		var runs counter
		s := startServer(t, b.Guard(), func(context.Context, string, *structpb.Struct) (proto.Message, error) {
			runs.inc()
			return &emptypb.Empty{}, nil
		})
		conn := dial(t, s)
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
			ctx := t.Context()
			for _, v := range tc.values {
				ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, v)
			}
			r := invoke(ctx, conn, methodCharge, "", req, &emptypb.Empty{})
			require.Equal(t, codes.InvalidArgument, status.Code(r.err), tc.name)
			require.Equal(t, idemgrpc.ReasonKeyInvalid, reason(r.err), tc.name)
		}
		require.Zero(t, runs.load())

		long := strings.Repeat("k", 255) // the longest key; the operation key is hashed
		require.NoError(t, invoke(t.Context(), conn, methodCharge, long, req, &emptypb.Empty{}).err)
		require.True(t, invoke(t.Context(), conn, methodCharge, long, req, &emptypb.Empty{}).replayed)
		// A quoted key is the same key, as in the HTTP middleware.
		require.NoError(t, invoke(t.Context(), conn, methodCharge, "k-1", req, &emptypb.Empty{}).err)
		require.True(t, invoke(t.Context(), conn, methodCharge, `"k-1"`, req, &emptypb.Empty{}).replayed)
		require.EqualValues(t, 2, runs.load())
	})
}

func TestTwoTenants(t *testing.T) {
	tenantOf := func(ctx context.Context) string {
		v := metadata.ValueFromIncomingContext(ctx, "tenant") // an authentication interceptor's job
		if len(v) != 1 {
			return ""
		}
		return v[0]
	}
	forEachBackend(t, func(t *testing.T, b *backend) {
		var runs counter
		s := startServer(t, b.Guard(), func(ctx context.Context, _ string, _ *structpb.Struct) (proto.Message, error) {
			runs.inc()
			return wrapperspb.String("for " + tenantOf(ctx)), nil
		}, idemgrpc.WithScope(tenantOf))
		conn := dial(t, s)
		key := idemclient.NewKey()
		req := request(t, map[string]any{"amount": 1})
		as := func(tenant string) reply {
			return invoke(metadata.AppendToOutgoingContext(t.Context(), "tenant", tenant), conn, methodRefund, key, req, &wrapperspb.StringValue{})
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

		r = invoke(t.Context(), conn, methodRefund, key, req, &wrapperspb.StringValue{}) // no tenant
		require.Equal(t, codes.Internal, status.Code(r.err))
		require.Equal(t, idemgrpc.ReasonScopeMissing, reason(r.err))
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
		conn := dial(t, s)
		req := request(t, map[string]any{"amount": 1000})
		for _, tc := range []struct {
			method string
			out    proto.Message
			typ    string
		}{
			{methodCharge, &structpb.Struct{}, "*structpb.Struct"},
			{methodRefund, &wrapperspb.StringValue{}, "*wrapperspb.StringValue"},
			{methodPing, &emptypb.Empty{}, "*emptypb.Empty"},
		} {
			before := len(s.answerTypes())
			key := idemclient.NewKey()
			first := invoke(t.Context(), conn, tc.method, key, req, tc.out)
			second := invoke(t.Context(), conn, tc.method, key, req, tc.out)
			require.NoError(t, first.err)
			require.NoError(t, second.err)
			require.True(t, second.replayed)
			require.True(t, proto.Equal(first.msg, second.msg))
			require.Equal(t, []string{tc.typ, tc.typ}, s.answerTypes()[before:])
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
			return wrapperspb.Int64(runs.inc()), nil
		}, idemgrpc.WithKeyFunc(requestID))
		conn := dial(t, s)
		req := request(t, map[string]any{"amount": 1, "request_id": idemclient.NewKey()})
		first := invoke(t.Context(), conn, methodCharge, "", req, &wrapperspb.Int64Value{})
		// The field wins over the metadata.
		second := invoke(t.Context(), conn, methodCharge, idemclient.NewKey(), req, &wrapperspb.Int64Value{})
		require.NoError(t, first.err)
		require.True(t, second.replayed)
		require.True(t, proto.Equal(first.msg, second.msg))

		// No request_id: the metadata key.
		plain := request(t, map[string]any{"amount": 1})
		key := idemclient.NewKey()
		require.False(t, invoke(t.Context(), conn, methodCharge, key, plain, &wrapperspb.Int64Value{}).replayed)
		require.True(t, invoke(t.Context(), conn, methodCharge, key, plain, &wrapperspb.Int64Value{}).replayed)
		require.EqualValues(t, 2, runs.load())

		tooLong := request(t, map[string]any{"request_id": strings.Repeat("r", 256)})
		r := invoke(t.Context(), conn, methodCharge, "", tooLong, &wrapperspb.Int64Value{})
		require.Equal(t, idemgrpc.ReasonKeyInvalid, reason(r.err))
	})
}

func TestSameKeyOtherMethodRuns(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		var runs counter
		s := startServer(t, b.Guard(), func(_ context.Context, method string, _ *structpb.Struct) (proto.Message, error) {
			runs.inc()
			return wrapperspb.String(method), nil
		})
		conn := dial(t, s)
		key := idemclient.NewKey()
		req := request(t, map[string]any{"amount": 1})
		for _, m := range []string{methodCharge, methodRefund, methodCharge, methodRefund} {
			r := invoke(t.Context(), conn, m, key, req, &wrapperspb.StringValue{})
			require.NoError(t, r.err)
			require.Equal(t, m, r.msg.(*wrapperspb.StringValue).GetValue())
		}
		require.EqualValues(t, 2, runs.load())
	})
}
