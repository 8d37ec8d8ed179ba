// Package idemtest checks implementations of idem.Store against the store
// contract, in the spirit of testing/slogtest. Run it from a test of your
// store:
//
//	func TestMyStore(t *testing.T) {
//		idemtest.Run(t, idemtest.Harness{
//			New: func(t *testing.T) (idem.Store, func(time.Duration)) {
//				return newMyStore(t), time.Sleep
//			},
//		})
//	}
//
// Every check is a subtest on ids of its own, so one store may serve them
// all.
package idemtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// Harness is what Run needs to exercise a store.
type Harness struct {
	// New returns the store under test and a function that moves the
	// store's clock forward by d: time.Sleep for a real server, FastForward
	// for miniredis. It is called once per check.
	New func(t *testing.T) (s idem.Store, advance func(d time.Duration))
	// Lease is the lease the checks use; it must be long enough for a few
	// round trips and short enough to wait out. The default is 300ms.
	Lease time.Duration
}

// Run runs the store contract checks as subtests of t.
func Run(t *testing.T, h Harness) {
	if h.Lease <= 0 {
		h.Lease = 300 * time.Millisecond
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			s, advance := h.New(t)
			c.run(t, env{h.Lease, advance}, s)
		})
	}
}

// env is what a check sees of the harness.
type env struct {
	Lease   time.Duration
	Advance func(time.Duration)
}

var checks = []struct {
	name string
	run  func(t *testing.T, h env, s idem.Store)
}{
	{"ClaimAbsent", claimAbsent},
	{"ClaimBusy", claimBusy},
	{"ClaimRepeatedByOwner", claimRepeatedByOwner},
	{"ClaimMismatch", claimMismatch},
	{"CompleteAndReplay", completeAndReplay},
	{"CompleteRepeatedByOwner", completeRepeatedByOwner},
	{"CompleteByStaleOwner", completeByStaleOwner},
	{"ReleaseKeepsFenceAndCheckpoints", releaseKeepsFenceAndCheckpoints},
	{"ReleaseByStranger", releaseByStranger},
	{"TakeoverAfterLeaseExpiry", takeoverAfterLeaseExpiry},
	{"Heartbeat", heartbeat},
	{"CheckpointReplaces", checkpointReplaces},
	{"CheckpointBinary", checkpointBinary},
	{"ReadAbsent", readAbsent},
	{"TTLs", ttls},
}

var ctx = context.Background()

func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func newToken(t *testing.T) string {
	t.Helper()
	return "o" + newID()[:15]
}

func req(h env, owner, fp string) idem.ClaimRequest {
	return idem.ClaimRequest{Owner: owner, Fingerprint: fp, Lease: h.Lease, TTL: h.Lease + time.Hour}
}

func claim(t *testing.T, s idem.Store, id string, r idem.ClaimRequest, want idem.ClaimStatus) idem.ClaimResult {
	t.Helper()
	res, err := s.Claim(ctx, id, r)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if res.Status != want {
		t.Fatalf("Claim: status %v, want %v (%+v)", res.Status, want, res)
	}
	return res
}

func noErr(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func leaseLost(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("%s: got %v, want ErrLeaseLost", what, err)
	}
}

func claimAbsent(t *testing.T, h env, s idem.Store) {
	res := claim(t, s, newID(), req(h, newToken(t), "fp"), idem.Claimed)
	if res.Fence != 1 || len(res.Checkpoints) != 0 {
		t.Fatalf("first claim: fence %d, checkpoints %v; want 1 and none", res.Fence, res.Checkpoints)
	}
}

func claimBusy(t *testing.T, h env, s idem.Store) {
	id := newID()
	claim(t, s, id, req(h, newToken(t), "fp"), idem.Claimed)
	res := claim(t, s, id, req(h, newToken(t), "fp"), idem.Busy)
	if res.RetryAfter <= 0 || res.RetryAfter > h.Lease {
		t.Fatalf("busy: RetryAfter %v, want in (0, %v]", res.RetryAfter, h.Lease)
	}
}

func claimRepeatedByOwner(t *testing.T, h env, s idem.Store) {
	id, owner := newID(), newToken(t)
	claim(t, s, id, req(h, owner, "fp"), idem.Claimed)
	res := claim(t, s, id, req(h, owner, "fp"), idem.Claimed)
	if res.Fence != 1 {
		t.Fatalf("re-sent claim: fence %d, want 1", res.Fence)
	}
}

func claimMismatch(t *testing.T, h env, s idem.Store) {
	id, owner := newID(), newToken(t)
	claim(t, s, id, req(h, owner, "fp1"), idem.Claimed)
	claim(t, s, id, req(h, newToken(t), "fp2"), idem.Mismatch)
	noErr(t, "Complete", s.Complete(ctx, id, owner, []byte("done"), time.Hour))
	claim(t, s, id, req(h, newToken(t), "fp2"), idem.Mismatch)
}

func completeAndReplay(t *testing.T, h env, s idem.Store) {
	id, owner := newID(), newToken(t)
	claim(t, s, id, req(h, owner, "fp"), idem.Claimed)
	payload := []byte("result|with|bars\x00and\xffbytes")
	noErr(t, "Complete", s.Complete(ctx, id, owner, payload, time.Hour))
	res := claim(t, s, id, req(h, newToken(t), "fp"), idem.Completed)
	if string(res.Payload) != string(payload) {
		t.Fatalf("replay payload %q, want %q", res.Payload, payload)
	}
	r, err := s.Read(ctx, id)
	noErr(t, "Read", err)
	if r == nil || r.State != idem.StateCompleted || r.LeaseTTL != 0 {
		t.Fatalf("Read after complete: %+v, want COMPLETED without a lease", r)
	}
}

func completeRepeatedByOwner(t *testing.T, h env, s idem.Store) {
	id, owner := newID(), newToken(t)
	claim(t, s, id, req(h, owner, "fp"), idem.Claimed)
	noErr(t, "Complete", s.Complete(ctx, id, owner, []byte("a"), time.Hour))
	noErr(t, "re-sent Complete", s.Complete(ctx, id, owner, []byte("a"), time.Hour))
}

func completeByStaleOwner(t *testing.T, h env, s idem.Store) {
	id, stale := newID(), newToken(t)
	claim(t, s, id, req(h, stale, "fp"), idem.Claimed)
	h.Advance(h.Lease + h.Lease/2)
	fresh := newToken(t)
	res := claim(t, s, id, req(h, fresh, "fp"), idem.Claimed)
	if res.Fence != 2 {
		t.Fatalf("takeover fence %d, want 2", res.Fence)
	}
	leaseLost(t, "stale Complete", s.Complete(ctx, id, stale, []byte("stale"), time.Hour))
	leaseLost(t, "stale Heartbeat", s.Heartbeat(ctx, id, stale, h.Lease))
	leaseLost(t, "stale Checkpoint", s.Checkpoint(ctx, id, stale, "n", []byte("v")))
	leaseLost(t, "stale Release", s.Release(ctx, id, stale))
	noErr(t, "Complete", s.Complete(ctx, id, fresh, []byte("fresh"), time.Hour))
	res = claim(t, s, id, req(h, newToken(t), "fp"), idem.Completed)
	if string(res.Payload) != "fresh" {
		t.Fatalf("replay %q, want the taking-over owner's result", res.Payload)
	}
}

func releaseKeepsFenceAndCheckpoints(t *testing.T, h env, s idem.Store) {
	id, owner := newID(), newToken(t)
	claim(t, s, id, req(h, owner, "fp"), idem.Claimed)
	noErr(t, "Checkpoint", s.Checkpoint(ctx, id, owner, "charge", []byte("ch_1")))
	noErr(t, "Release", s.Release(ctx, id, owner))
	noErr(t, "re-sent Release", s.Release(ctx, id, owner))
	res := claim(t, s, id, req(h, newToken(t), "fp"), idem.Claimed)
	if res.Fence != 2 || string(res.Checkpoints["charge"]) != "ch_1" {
		t.Fatalf("claim after release: fence %d, checkpoints %q; want 2 and charge=ch_1", res.Fence, res.Checkpoints)
	}
}

func releaseByStranger(t *testing.T, h env, s idem.Store) {
	id := newID()
	claim(t, s, id, req(h, newToken(t), "fp"), idem.Claimed)
	leaseLost(t, "stranger Release", s.Release(ctx, id, newToken(t)))
	claim(t, s, id, req(h, newToken(t), "fp"), idem.Busy)
	leaseLost(t, "Release of an absent record", s.Release(ctx, newID(), newToken(t)))
}

func takeoverAfterLeaseExpiry(t *testing.T, h env, s idem.Store) {
	id, dead := newID(), newToken(t)
	claim(t, s, id, req(h, dead, "fp"), idem.Claimed)
	noErr(t, "Checkpoint", s.Checkpoint(ctx, id, dead, "step", []byte("1")))
	claim(t, s, id, req(h, newToken(t), "fp"), idem.Busy)
	h.Advance(h.Lease + h.Lease/2)
	res := claim(t, s, id, req(h, newToken(t), "fp"), idem.Claimed)
	if res.Fence != 2 || string(res.Checkpoints["step"]) != "1" {
		t.Fatalf("takeover: fence %d, checkpoints %q; want 2 and step=1", res.Fence, res.Checkpoints)
	}
}

func heartbeat(t *testing.T, h env, s idem.Store) {
	id, owner := newID(), newToken(t)
	claim(t, s, id, req(h, owner, "fp"), idem.Claimed)
	for range 3 {
		h.Advance(h.Lease / 2)
		noErr(t, "Heartbeat", s.Heartbeat(ctx, id, owner, h.Lease))
	}
	// 1.5 leases have passed since the claim: only the heartbeat kept it.
	claim(t, s, id, req(h, newToken(t), "fp"), idem.Busy)
	leaseLost(t, "stranger Heartbeat", s.Heartbeat(ctx, id, newToken(t), h.Lease))
}

func checkpointReplaces(t *testing.T, h env, s idem.Store) {
	id, owner := newID(), newToken(t)
	claim(t, s, id, req(h, owner, "fp"), idem.Claimed)
	noErr(t, "Checkpoint", s.Checkpoint(ctx, id, owner, "a", []byte("1")))
	noErr(t, "Checkpoint", s.Checkpoint(ctx, id, owner, "b", []byte("2")))
	noErr(t, "Checkpoint", s.Checkpoint(ctx, id, owner, "a", []byte("3")))
	r, err := s.Read(ctx, id)
	noErr(t, "Read", err)
	if len(r.Checkpoints) != 2 || string(r.Checkpoints["a"]) != "3" || string(r.Checkpoints["b"]) != "2" {
		t.Fatalf("checkpoints %q, want a=3 b=2", r.Checkpoints)
	}
	noErr(t, "Complete", s.Complete(ctx, id, owner, nil, time.Hour))
	leaseLost(t, "Checkpoint after Complete", s.Checkpoint(ctx, id, owner, "c", nil))
}

func checkpointBinary(t *testing.T, h env, s idem.Store) {
	id, owner := newID(), newToken(t)
	claim(t, s, id, req(h, owner, "fp"), idem.Claimed)
	odd := map[string][]byte{"x:|1": []byte("4:ab|\x00\xff:"), "empty": {}, "12:": []byte("::")}
	for k, v := range odd {
		noErr(t, "Checkpoint", s.Checkpoint(ctx, id, owner, k, v))
	}
	noErr(t, "Release", s.Release(ctx, id, owner))
	res := claim(t, s, id, req(h, newToken(t), "fp"), idem.Claimed)
	for k, v := range odd {
		if string(res.Checkpoints[k]) != string(v) {
			t.Fatalf("checkpoint %q = %q, want %q", k, res.Checkpoints[k], v)
		}
	}
}

func readAbsent(t *testing.T, h env, s idem.Store) {
	r, err := s.Read(ctx, newID())
	noErr(t, "Read", err)
	if r != nil {
		t.Fatalf("Read of an absent id: %+v, want nil", r)
	}
}

func ttls(t *testing.T, h env, s idem.Store) {
	id, owner := newID(), newToken(t)
	r := req(h, owner, "fp")
	claim(t, s, id, r, idem.Claimed)
	rec, err := s.Read(ctx, id)
	noErr(t, "Read", err)
	if rec.TTL <= 0 || rec.TTL > r.TTL || rec.LeaseTTL <= 0 || rec.LeaseTTL > h.Lease {
		t.Fatalf("in progress: TTL %v (want in (0, %v]), lease TTL %v (want in (0, %v])", rec.TTL, r.TTL, rec.LeaseTTL, h.Lease)
	}
	noErr(t, "Complete", s.Complete(ctx, id, owner, []byte("x"), 2*time.Hour))
	rec, err = s.Read(ctx, id)
	noErr(t, "Read", err)
	if rec.TTL <= time.Hour || rec.TTL > 2*time.Hour {
		t.Fatalf("completed: TTL %v, want the retention, 2h", rec.TTL)
	}
}
