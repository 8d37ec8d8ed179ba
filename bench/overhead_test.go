package main

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// cannedStore answers every Claim without I/O: Claimed for fresh runs, or
// Completed with a fixed payload for replays. It isolates the engine's own
// CPU and allocations per Do (fingerprint, token, JSON, bookkeeping) from
// Redis and go-redis.
type cannedStore struct {
	replay []byte // nil: claim succeeds
}

func (s *cannedStore) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	if s.replay != nil {
		return idemstore.ClaimResult{Status: idemstore.ClaimCompleted, Payload: s.replay}, nil
	}
	return idemstore.ClaimResult{Status: idemstore.ClaimOK, Fence: 1}, nil
}
func (s *cannedStore) Heartbeat(ctx context.Context, id, owner string, lease time.Duration) error {
	return nil
}
func (s *cannedStore) Checkpoint(ctx context.Context, id, owner, name string, value []byte) error {
	return nil
}
func (s *cannedStore) Complete(ctx context.Context, id, owner string, payload []byte, retention time.Duration) error {
	return nil
}
func (s *cannedStore) Release(ctx context.Context, id, owner string) error { return nil }
func (s *cannedStore) Read(ctx context.Context, id string) (*idemstore.Record, error) {
	return nil, nil
}

// BenchmarkEngineFresh: idem.Do's CPU for a fresh key, store excluded.
func BenchmarkEngineFresh(b *testing.B) {
	g := idem.New(&cannedStore{})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := idem.Do(ctx, g, "order-0123456789", theReq, func(ctx context.Context, a *idem.Attempt) (payment, error) {
			return thePayment, nil
		}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEngineReplay: idem.Do's CPU for a replay, store excluded.
func BenchmarkEngineReplay(b *testing.B) {
	g := idem.New(&cannedStore{replay: append([]byte{'v'}, rawPayload...)})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := idem.Do(ctx, g, "order-0123456789", theReq, func(ctx context.Context, a *idem.Attempt) (payment, error) {
			b.Fatal("replay ran fn")
			return payment{}, nil
		}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEngineFreshSealed: BenchmarkEngineFresh with WithSealer (AES-256-GCM
// and a keyed fingerprint): what sealing adds to the engine's CPU.
func BenchmarkEngineFreshSealed(b *testing.B) {
	s, err := benchSealer()
	if err != nil {
		b.Fatal(err)
	}
	g := idem.New(&cannedStore{}, idem.WithSealer(s))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := idem.Do(ctx, g, "order-0123456789", theReq, func(ctx context.Context, a *idem.Attempt) (payment, error) {
			return thePayment, nil
		}); err != nil {
			b.Fatal(err)
		}
	}
}
