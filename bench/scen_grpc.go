package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem/contrib/idemgrpc"
)

// The gRPC scenario: a unary payments handler served bare and behind
// idemgrpc.UnaryServerInterceptor, both over loopback TCP, called with a
// fresh key per call and with one completed key (a replay), interleaved in
// the same rounds.

const grpcMethod = "/bench.Payments/Charge"

// grpcChargeFunc is the handler of the benchmark's payments service.
type grpcChargeFunc func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error)

// grpcPaymentsDesc is what protoc-gen-go-grpc would generate for
//
//	service Payments { rpc Charge(google.protobuf.Struct) returns (google.protobuf.Struct); }
var grpcPaymentsDesc = grpc.ServiceDesc{
	ServiceName: "bench.Payments",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Charge",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(structpb.Struct)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				return srv.(grpcChargeFunc)(ctx, req.(*structpb.Struct))
			}
			if interceptor == nil {
				return h(ctx, in)
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: grpcMethod}, h)
		},
	}},
}

// grpcReq and grpcResp are the request and the answer of every call, the
// HTTP scenario's payment as well-known types.
var grpcReq, grpcResp = mustStruct(map[string]any{"amount": 1250, "currency": "EUR", "customer": "cus_0123456789"}),
	mustStruct(map[string]any{
		"id": "pay_8f14e45fceea167a5a36dedd4bea2543", "amount": 1250, "currency": "EUR", "status": "succeeded",
		"customer": "cus_0123456789", "created": "2026-01-02T03:04:05Z", "receipt": "rc_0123456789abcdef0123456789abcdef",
		"description": "order 1042, two items, shipped to Paris",
	})

func mustStruct(m map[string]any) *structpb.Struct {
	s, err := structpb.NewStruct(m)
	if err != nil {
		panic(err)
	}
	return s
}

// grpcTarget is one server on 127.0.0.1 and a client connection to it.
type grpcTarget struct {
	conn    *grpc.ClientConn
	effects atomic.Int64
	replays atomic.Int64
}

// newGRPCTarget serves the payments handler behind the interceptors, if any.
func newGRPCTarget(e *env, interceptors ...grpc.UnaryServerInterceptor) (*grpcTarget, error) {
	t := &grpcTarget{}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(interceptors...))
	srv.RegisterService(&grpcPaymentsDesc, grpcChargeFunc(func(context.Context, *structpb.Struct) (*structpb.Struct, error) {
		t.effects.Add(1)
		return grpcResp, nil
	}))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() { _ = srv.Serve(l) }()
	e.onClose(srv.Stop)
	t.conn, err = grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	e.onClose(func() { _ = t.conn.Close() })
	return t, nil
}

// charge calls the handler with key in the idempotency-key metadata and
// reports whether the answer was marked as a replay.
func (t *grpcTarget) charge(ctx context.Context, key string) (replayed bool, err error) {
	ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)
	var header metadata.MD
	resp := new(structpb.Struct)
	if err := t.conn.Invoke(ctx, grpcMethod, grpcReq, resp, grpc.Header(&header)); err != nil {
		return false, err
	}
	if !proto.Equal(resp, grpcResp) {
		return false, fmt.Errorf("unexpected answer %v", resp)
	}
	if len(header.Get(idemgrpc.ReplayedKey)) > 0 {
		t.replays.Add(1)
		return true, nil
	}
	return false, nil
}

// runGRPC is scenario 2b: a bare gRPC handler vs the same handler behind
// idemgrpc.UnaryServerInterceptor, fresh keys and replays, at 1 client and
// at -clients.
func runGRPC(ctx context.Context, e *env) error {
	levels := []int{1}
	if e.cfg.clients != 1 {
		levels = append(levels, e.cfg.clients)
	}
	sec := e.rep.section("2b. gRPC: bare handler vs idemgrpc.UnaryServerInterceptor", "")
	var freshCalls, freshRuns, replayCalls, replayRuns int64
	for _, clients := range levels {
		bare, err := newGRPCTarget(e)
		if err != nil {
			return err
		}
		rc, rh := e.client(0, clients)
		guard := e.guard(rc, fmt.Sprintf("grpc-%s-%d", e.nonce, clients))
		guarded, err := newGRPCTarget(e, idemgrpc.UnaryServerInterceptor(guard))
		if err != nil {
			return err
		}

		progress("scenario 2b: gRPC, %d clients", clients)
		keys := keyer("gf")
		base := &variant{name: "bare handler", clients: clients, srv: e.serverUsec,
			op: func(ctx context.Context, w int, seq uint64) error {
				_, err := bare.charge(ctx, keys.key(w, seq))
				return err
			}}
		fresh := &variant{name: "idemgrpc, fresh keys", clients: clients, rt: rh.n, srv: e.serverUsec,
			op: func(ctx context.Context, w int, seq uint64) error {
				replayed, err := guarded.charge(ctx, keys.key(w, seq))
				if err == nil && replayed {
					err = errors.New("a fresh key was answered as a replay")
				}
				return err
			}}
		const replayKey = "gr-the-one-key"
		var runs0 atomic.Int64 // handler runs when the round started
		replay := &variant{name: "idemgrpc, replays of one key", clients: clients, rt: rh.n, srv: e.serverUsec,
			setup: func(ctx context.Context) error {
				_, err := guarded.charge(ctx, replayKey)
				return err
			},
			before: func(context.Context) error { runs0.Store(guarded.effects.Load()); return nil },
			op: func(ctx context.Context, w int, seq uint64) error {
				replayed, err := guarded.charge(ctx, replayKey)
				switch {
				case err != nil:
				case !replayed:
					err = errors.New("a completed key was not answered as a replay")
				case guarded.effects.Load() != runs0.Load(): // the variants never run at the same time
					err = errors.New("a replay ran the handler")
				}
				return err
			}}
		if err := compare(ctx, scaled(e.cfg, grpcScale), fmt.Sprintf("gRPC, %d clients", clients), base, fresh, replay); err != nil {
			return err
		}
		sec.pair(base, fresh)
		sec.pair(base, replay)
		freshCalls, replayCalls = freshCalls+int64(fresh.ops), replayCalls+int64(replay.ops)
		freshRuns, replayRuns = freshRuns+guarded.effects.Load(), replayRuns+guarded.replays.Load()
		if clients == e.cfg.clients {
			e.rep.maxTarget("gRPC: round trips per fresh call (batched by default: shared round trips count as less)", fresh.rtPerOp(), 2, fmtF(fresh.rtPerOp(), 2), "≤ 2")
			e.rep.maxTarget("gRPC: round trips per replay (batched by default: shared round trips count as less)", replay.rtPerOp(), 1, fmtF(replay.rtPerOp(), 2), "≤ 1")
			e.rep.chartExtra = append(e.rep.chartExtra,
				chartRatio{fmt.Sprintf("gRPC c%d fresh", clients), ratio(fresh, base), math.NaN()},
				chartRatio{fmt.Sprintf("gRPC c%d replay", clients), ratio(replay, base), math.NaN()})
		}
	}
	sec.note = fmt.Sprintf("%v per variant in %d rounds (-duration × %g: its targets are round trips, exact at any length). ",
		scaled(e.cfg, grpcScale).duration, e.cfg.rounds, grpcScale) + fmt.Sprintf("Each side is a `grpc.Server` on 127.0.0.1 (TCP, plaintext HTTP/2) called through one "+
		"`grpc.ClientConn` shared by the clients; the service is built with `grpc.ServiceDesc` over `google.protobuf.Struct` "+
		"(request %d B, answer %d B encoded). Every call carries an `idempotency-key` metadata (the bare handler gets "+
		"it too and ignores it), so the only difference is the server interceptor, with a default Guard (no WithWait). "+
		"Fresh: a new key per call (claim, handler, complete). Replays: one key completed before the first round, "+
		"sent again by every call. The three variants alternate in the same rounds. Allocations are the whole "+
		"process's: gRPC client and server, go-redis. RT/op counts the interceptor's Redis round trips. Behind the "+
		"interceptor the handler ran %d times (measured fresh calls: %d; the rest are warm-up rounds and the replay key); "+
		"%d answers were marked `idempotent-replayed: true` (measured replays: %d).",
		proto.Size(grpcReq), proto.Size(grpcResp), freshRuns, freshCalls, replayRuns, replayCalls)
	return nil
}

// grpcScale is the share of -duration each gRPC comparison measures per
// variant (the full run has a time budget of about 5 minutes).
const grpcScale = 0.5
