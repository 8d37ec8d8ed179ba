package idemgrpc_test

import (
	"context"
	"os/exec"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem/contrib/idemgrpc"
	"github.com/idemkit/idem/contrib/internal/backendtest"
	"github.com/idemkit/idem/idemclient"
)

// BenchmarkInterceptor measures a unary call over loopback TCP: a bare
// handler, and the same handler behind idem's interceptor with a fresh key
// per call (claim and complete) and with one key (a replay), in one run. It
// uses a redis-server when one is on PATH, else miniredis.
func BenchmarkInterceptor(b *testing.B) {
	addr := ""
	if _, err := exec.LookPath("redis-server"); err == nil {
		addr = backendtest.RedisServer(b)
	} else {
		addr = miniredis.RunT(b).Addr()
		b.Log("redis-server not on PATH: on miniredis")
	}
	back := backendtest.NewKillable(b, addr, nil)
	h := func(context.Context, string, *structpb.Struct) (proto.Message, error) {
		return structpb.NewStruct(map[string]any{"receipt": "rc_1", "amount": 1000})
	}
	req, err := structpb.NewStruct(map[string]any{"amount": 1000, "currency": "EUR"})
	require.NoError(b, err)
	bare := dial(b, startServer(b, nil, h))
	guarded := dial(b, startServer(b, back.Guard(), h))

	run := func(b *testing.B, conn *grpc.ClientConn, key func() string) {
		b.ReportAllocs()
		for b.Loop() {
			ctx := context.Background()
			if key != nil {
				ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key())
			}
			if err := conn.Invoke(ctx, methodCharge, req, new(structpb.Struct)); err != nil {
				b.Fatal(err)
			}
		}
	}
	replayKey := idemclient.NewKey()
	b.Run("bare", func(b *testing.B) { run(b, bare, nil) })
	b.Run("fresh", func(b *testing.B) { run(b, guarded, idemclient.NewKey) })
	b.Run("replay", func(b *testing.B) { run(b, guarded, func() string { return replayKey }) })
}
