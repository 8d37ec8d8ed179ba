package idemconnect_test

import (
	"context"
	"os/exec"
	"testing"

	"connectrpc.com/connect"
	"github.com/alicebob/miniredis/v2"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem/contrib/idemconnect"
	"github.com/idemkit/idem/contrib/internal/backendtest"
	"github.com/idemkit/idem/idemclient"
)

// BenchmarkInterceptor measures a unary Connect call over loopback TCP: a
// bare handler, and the same handler behind idem's interceptor with a fresh
// key per call (claim and complete) and with one key (a replay), in one run.
// It uses a redis-server when one is on PATH, else miniredis.
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
	bare := newClient(b, startServer(b, nil, h))
	guarded := newClient(b, startServer(b, back.Guard(), h))

	run := func(b *testing.B, c *client, key func() string) {
		b.ReportAllocs()
		for b.Loop() {
			r := connect.NewRequest(req)
			if key != nil {
				r.Header().Set(idemconnect.KeyHeader, key())
			}
			if _, err := c.charge.CallUnary(context.Background(), r); err != nil {
				b.Fatal(err)
			}
		}
	}
	replayKey := idemclient.NewKey()
	b.Run("bare", func(b *testing.B) { run(b, bare, nil) })
	b.Run("fresh", func(b *testing.B) { run(b, guarded, idemclient.NewKey) })
	b.Run("replay", func(b *testing.B) { run(b, guarded, func() string { return replayKey }) })
}
