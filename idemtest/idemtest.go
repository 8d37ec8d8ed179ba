// Package idemtest checks implementations of idemstore.Store against the store
// contract, in the spirit of testing/slogtest. Run it from a test of your
// store:
//
//	func TestMyStore(t *testing.T) {
//		idemtest.Run(t, idemtest.Harness{
//			New: func(t *testing.T) (idemstore.Store, func(time.Duration)) {
//				return newMyStore(t), time.Sleep
//			},
//		})
//	}
//
// Every check is a subtest on ids of its own, so one store may serve them
// all. Each states the sentence of the contract it verifies, and prints it
// when it fails. Checks that look at what was stored (TTLs, checkpoints as
// kept) run when the store also implements idemstore.Reader, and skip
// otherwise.
package idemtest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// Harness is what Run needs to exercise a store.
type Harness struct {
	// New returns the store under test and a function that moves the
	// store's clock forward by d: time.Sleep for a real server, FastForward
	// for miniredis. It is called once per check.
	New func(t *testing.T) (s idemstore.Store, advance func(d time.Duration))
	// Lease is the lease the checks use; it must be long enough for a few
	// round trips and short enough to wait out. The default is 300ms.
	Lease time.Duration
}

// Run runs the store contract checks as subtests of t.
func Run(t *testing.T, h Harness) {
	if h.Lease <= 0 {
		h.Lease = 300 * time.Millisecond
	}
	for _, ch := range checks {
		t.Run(ch.name, func(t *testing.T) {
			s, advance := h.New(t)
			r, _ := s.(idemstore.Reader)
			ch.run(&checker{T: t, contract: ch.contract, lease: h.Lease, advance: advance, s: s, r: r})
		})
	}
}

// checker is what a check works with: the store, the harness, and the
// contract sentence its failures quote.
type checker struct {
	*testing.T
	contract string
	lease    time.Duration
	advance  func(time.Duration)
	s        idemstore.Store
	r        idemstore.Reader // nil when the store cannot read records
}

// fail ends the check, quoting the contract it verifies.
func (c *checker) fail(format string, args ...any) {
	c.Helper()
	c.Fatalf("%s\n\tcontract: %s", fmt.Sprintf(format, args...), c.contract)
}

func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func newToken() string { return "o" + newID()[:15] }

func (c *checker) req(owner, fp string) idemstore.ClaimRequest {
	return idemstore.ClaimRequest{Owner: owner, Fingerprint: fp, Lease: c.lease, TTL: c.lease + time.Hour}
}

// claim claims id and fails the check unless the outcome is want.
func (c *checker) claim(id string, r idemstore.ClaimRequest, want idemstore.ClaimStatus) idemstore.ClaimResult {
	c.Helper()
	res, err := c.s.Claim(c.Context(), id, r)
	if err != nil {
		c.fail("Claim: %v", err)
	}
	if res.Status != want {
		c.fail("Claim: status %v, want %v (%+v)", res.Status, want, res)
	}
	return res
}

func (c *checker) noErr(what string, err error) {
	c.Helper()
	if err != nil {
		c.fail("%s: %v", what, err)
	}
}

func (c *checker) leaseLost(what string, err error) {
	c.Helper()
	if !errors.Is(err, idem.ErrLeaseLost) {
		c.fail("%s: got %v, want ErrLeaseLost", what, err)
	}
}

// read reads a record back; a store without idemstore.Reader skips the check.
func (c *checker) read(id string) *idemstore.Record {
	c.Helper()
	if c.r == nil {
		c.Skip("the store does not implement idemstore.Reader")
	}
	r, err := c.r.Read(c.Context(), id)
	c.noErr("Read", err)
	return r
}

// stored reads back a record that must exist, and fails the check when it
// does not.
func (c *checker) stored(id string) *idemstore.Record {
	c.Helper()
	r := c.read(id)
	if r == nil {
		c.fail("Read: no record, want the one written")
	}
	return r
}

var checks = []struct {
	name, contract string
	run            func(c *checker)
}{
	{"ClaimAbsent", "A claim of an absent record starts at fence 1, without checkpoints.", claimAbsent},
	{"ClaimBusy", "A claim of a record whose lease another owner holds is busy for the lease's remaining time.", claimBusy},
	{"ClaimRepeatedByOwner", "A claim re-sent by the record's own owner reports ClaimOK again, at the same fence.", claimRepeatedByOwner},
	{"ClaimMismatch", "A claim with another fingerprint is a mismatch, in progress and completed.", claimMismatch},
	{"ClaimKeyedFingerprints", "A claim matches a record keyed with another listed key (OtherFingerprints); one keyed with a key it does not list, or of the other kind (keyed, plain), is ClaimUnreadable.", claimKeyedFingerprints},
	{"ClaimConcurrent", "Of concurrent claims of one absent record, exactly one gets ClaimOK; the others are busy.", claimConcurrent},
	{"CompleteAndReplay", "Complete stores the payload byte for byte and drops the lease; a later claim replays it.", completeAndReplay},
	{"CompleteRepeatedByOwner", "A complete re-sent by its owner succeeds again.", completeRepeatedByOwner},
	{"CompleteByStaleOwner", "An owner whose record was taken over gets ErrLeaseLost from every method and changes nothing.", completeByStaleOwner},
	{"ReleaseKeepsFenceAndCheckpoints", "Release frees the key; the next claim gets fence+1 and the checkpoints.", releaseKeepsFenceAndCheckpoints},
	{"ReleaseByStranger", "Release by anyone but the owner, or of an absent record, is ErrLeaseLost and keeps the lease.", releaseByStranger},
	{"TakeoverAfterLeaseExpiry", "Once the lease expires, the next claim takes over with fence+1 and the checkpoints.", takeoverAfterLeaseExpiry},
	{"Heartbeat", "Heartbeat renews the owner's lease for another lease; a stranger's is ErrLeaseLost.", heartbeat},
	{"CheckpointReplaces", "A checkpoint replaces an earlier value of its name; none is accepted once completed.", checkpointReplaces},
	{"CheckpointBinary", "Checkpoint names and values are kept byte for byte, whatever bytes they hold.", checkpointBinary},
	{"ReadAbsent", "Read of an absent record returns nil, without an error.", readAbsent},
	{"TTLs", "Every key has a TTL: lease + retention while unfinished, the retention once completed.", ttls},
	{"WritesKeepTTL", "Checkpoint and release keep the record's TTL; they never extend nor drop it.", writesKeepTTL},
	{"UnclaimTakesFenceBack", "Unclaim (idemstore.Unclaimer) frees the key and takes its fence back: the next claim gets the same fence and the checkpoints; a record the claim created is gone.", unclaimTakesFenceBack},
	{"UnclaimRefusesLateCopy", "After Unclaim, a claim of the same owner reaching the store is busy, whether the record existed or not; a stranger's Unclaim changes nothing (it may ask to be called again while another owner holds the lease).", unclaimRefusesLateCopy},
}

// unclaimer returns the store as an idemstore.Unclaimer, or skips the check.
func (c *checker) unclaimer() idemstore.Unclaimer {
	u, ok := c.s.(idemstore.Unclaimer)
	if !ok {
		c.Skip("the store does not implement idemstore.Unclaimer")
	}
	return u
}

func unclaimTakesFenceBack(c *checker) {
	u := c.unclaimer()
	id, owner := newID(), newToken()
	c.claim(id, c.req(owner, "fp"), idemstore.ClaimOK)
	c.noErr("Unclaim", u.Unclaim(c.Context(), id, owner, c.lease))
	if c.r != nil && c.read(id) != nil {
		c.fail("Unclaim of a record its claim created left it in place")
	}
	res := c.claim(id, c.req(newToken(), "fp"), idemstore.ClaimOK)
	if res.Fence != 1 {
		c.fail("claim after Unclaim of a new record: fence %d, want 1", res.Fence)
	}
	// A takeover taken back: the fence goes back to the dead attempt's.
	id, first, second := newID(), newToken(), newToken()
	c.claim(id, c.req(first, "fp"), idemstore.ClaimOK)
	c.noErr("Checkpoint", c.s.Checkpoint(c.Context(), id, first, "charge", []byte("ch_1")))
	c.noErr("Release", c.s.Release(c.Context(), id, first))
	c.claim(id, c.req(second, "fp"), idemstore.ClaimOK)
	c.noErr("Unclaim", u.Unclaim(c.Context(), id, second, c.lease))
	res = c.claim(id, c.req(newToken(), "fp"), idemstore.ClaimOK)
	if res.Fence != 2 || string(res.Checkpoints["charge"]) != "ch_1" {
		c.fail("claim after Unclaim of a takeover: fence %d, checkpoints %q; want 2 and charge=ch_1", res.Fence, res.Checkpoints)
	}
}

func unclaimRefusesLateCopy(c *checker) {
	u := c.unclaimer()
	// The claim never reached the store before Unclaim: its copy is busy.
	id, late := newID(), newToken()
	c.noErr("Unclaim of an absent record", u.Unclaim(c.Context(), id, late, c.lease))
	c.claim(id, c.req(late, "fp"), idemstore.ClaimBusy)
	res := c.claim(id, c.req(newToken(), "fp"), idemstore.ClaimOK)
	if res.Fence != 1 {
		c.fail("claim after a refused copy: fence %d, want 1", res.Fence)
	}
	// The claim ran, then was taken back: a copy re-sent later is busy.
	id, owner := newID(), newToken()
	c.claim(id, c.req(owner, "fp"), idemstore.ClaimOK)
	c.noErr("Unclaim", u.Unclaim(c.Context(), id, owner, c.lease))
	c.claim(id, c.req(owner, "fp"), idemstore.ClaimBusy)
	// A stranger's Unclaim leaves the holder's claim alone.
	id, holder := newID(), newToken()
	c.claim(id, c.req(holder, "fp"), idemstore.ClaimOK)
	_ = u.Unclaim(c.Context(), id, newToken(), c.lease) // nil, or an error asking to be called again
	c.claim(id, c.req(newToken(), "fp"), idemstore.ClaimBusy)
	c.noErr("Complete", c.s.Complete(c.Context(), id, holder, []byte("done"), time.Hour))
}

func claimAbsent(c *checker) {
	res := c.claim(newID(), c.req(newToken(), "fp"), idemstore.ClaimOK)
	if res.Fence != 1 || len(res.Checkpoints) != 0 {
		c.fail("first claim: fence %d, checkpoints %v; want 1 and none", res.Fence, res.Checkpoints)
	}
}

func claimBusy(c *checker) {
	id := newID()
	c.claim(id, c.req(newToken(), "fp"), idemstore.ClaimOK)
	res := c.claim(id, c.req(newToken(), "fp"), idemstore.ClaimBusy)
	if res.RetryAfter <= 0 || res.RetryAfter > c.lease {
		c.fail("busy: RetryAfter %v, want in (0, %v]", res.RetryAfter, c.lease)
	}
}

func claimRepeatedByOwner(c *checker) {
	id, owner := newID(), newToken()
	c.claim(id, c.req(owner, "fp"), idemstore.ClaimOK)
	if res := c.claim(id, c.req(owner, "fp"), idemstore.ClaimOK); res.Fence != 1 {
		c.fail("re-sent claim: fence %d, want 1", res.Fence)
	}
}

func claimMismatch(c *checker) {
	id, owner := newID(), newToken()
	c.claim(id, c.req(owner, "fp1"), idemstore.ClaimOK)
	c.claim(id, c.req(newToken(), "fp2"), idemstore.ClaimMismatch)
	c.noErr("Complete", c.s.Complete(c.Context(), id, owner, []byte("done"), time.Hour))
	c.claim(id, c.req(newToken(), "fp2"), idemstore.ClaimMismatch)
}

func claimKeyedFingerprints(c *checker) {
	keyed := func(fp string, others ...string) idemstore.ClaimRequest {
		r := c.req(newToken(), fp)
		r.OtherFingerprints = others
		return r
	}
	id, owner := newID(), newToken()
	c.claim(id, c.req(owner, "k1.MAC1"), idemstore.ClaimOK)
	c.noErr("Complete", c.s.Complete(c.Context(), id, owner, []byte("done"), time.Hour))
	c.claim(id, keyed("k2.MAC2", "k1.MAC1"), idemstore.ClaimCompleted)           // after a rotation: the same request
	c.claim(id, keyed("k2.MAC2", "k0.MAC0", "k1.MACX"), idemstore.ClaimMismatch) // another request, under the old key
	c.claim(id, keyed("k1.MACX"), idemstore.ClaimMismatch)                       // another request, under the same key
	c.claim(id, keyed("k2.MAC2"), idemstore.ClaimUnreadable)                     // the old key is no longer listed
	c.claim(id, keyed("fp"), idemstore.ClaimUnreadable)                          // a caller without keyed fingerprints

	dotted := newID()
	c.claim(dotted, c.req(newToken(), "k.1.MAC1"), idemstore.ClaimOK)
	c.claim(dotted, keyed("k.2.MAC2", "k.MAC1"), idemstore.ClaimUnreadable) // key ids may hold dots: "k.1" is not "k"
	c.claim(dotted, keyed("k.2.MAC2", "k.1.MACX"), idemstore.ClaimMismatch)

	plain := newID()
	c.claim(plain, c.req(newToken(), "fp"), idemstore.ClaimOK)
	c.claim(plain, keyed("k1.MAC1"), idemstore.ClaimUnreadable) // a record written without keyed fingerprints

	// A takeover re-keys the record with the current key.
	moved, first := newID(), newToken()
	c.claim(moved, c.req(first, "k1.MAC1"), idemstore.ClaimOK)
	c.noErr("Release", c.s.Release(c.Context(), moved, first))
	c.claim(moved, keyed("k2.MAC2", "k1.MAC1"), idemstore.ClaimOK)
	if r := c.stored(moved); r.Fingerprint != "k2.MAC2" {
		c.fail("fingerprint after a takeover with a new current key: %q, want k2.MAC2", r.Fingerprint)
	}
}

func claimConcurrent(c *checker) {
	const n = 16
	id := newID()
	type result struct {
		res idemstore.ClaimResult
		err error
	}
	out := make(chan result, n)
	for range n {
		go func() {
			res, err := c.s.Claim(c.Context(), id, c.req(newToken(), "fp"))
			out <- result{res, err}
		}()
	}
	won := 0
	for range n {
		r := <-out
		switch {
		case r.err != nil:
			c.fail("Claim: %v", r.err)
		case r.res.Status == idemstore.ClaimOK:
			won++
		case r.res.Status != idemstore.ClaimBusy:
			c.fail("Claim: status %v, want claimed or busy", r.res.Status)
		}
	}
	if won != 1 {
		c.fail("%d of %d concurrent claims won, want 1", won, n)
	}
}

func completeAndReplay(c *checker) {
	id, owner := newID(), newToken()
	c.claim(id, c.req(owner, "fp"), idemstore.ClaimOK)
	payload := []byte("result|with|bars\x00and\xffbytes")
	c.noErr("Complete", c.s.Complete(c.Context(), id, owner, payload, time.Hour))
	if res := c.claim(id, c.req(newToken(), "fp"), idemstore.ClaimCompleted); string(res.Payload) != string(payload) {
		c.fail("replay payload %q, want %q", res.Payload, payload)
	}
	if r := c.stored(id); r.State != idemstore.StateCompleted || r.LeaseTTL != 0 {
		c.fail("Read after complete: %+v, want COMPLETED without a lease", r)
	}
}

func completeRepeatedByOwner(c *checker) {
	id, owner := newID(), newToken()
	c.claim(id, c.req(owner, "fp"), idemstore.ClaimOK)
	c.noErr("Complete", c.s.Complete(c.Context(), id, owner, []byte("a"), time.Hour))
	c.noErr("re-sent Complete", c.s.Complete(c.Context(), id, owner, []byte("a"), time.Hour))
}

func completeByStaleOwner(c *checker) {
	ctx := c.Context()
	id, stale := newID(), newToken()
	c.claim(id, c.req(stale, "fp"), idemstore.ClaimOK)
	c.advance(c.lease + c.lease/2)
	fresh := newToken()
	if res := c.claim(id, c.req(fresh, "fp"), idemstore.ClaimOK); res.Fence != 2 {
		c.fail("takeover fence %d, want 2", res.Fence)
	}
	c.leaseLost("stale Complete", c.s.Complete(ctx, id, stale, []byte("stale"), time.Hour))
	c.leaseLost("stale Heartbeat", c.s.Heartbeat(ctx, id, stale, c.lease))
	c.leaseLost("stale Checkpoint", c.s.Checkpoint(ctx, id, stale, "n", []byte("v")))
	c.leaseLost("stale Release", c.s.Release(ctx, id, stale))
	c.noErr("Complete", c.s.Complete(ctx, id, fresh, []byte("fresh"), time.Hour))
	if res := c.claim(id, c.req(newToken(), "fp"), idemstore.ClaimCompleted); string(res.Payload) != "fresh" {
		c.fail("replay %q, want the taking-over owner's result", res.Payload)
	}
}

func releaseKeepsFenceAndCheckpoints(c *checker) {
	id, owner := newID(), newToken()
	c.claim(id, c.req(owner, "fp"), idemstore.ClaimOK)
	c.noErr("Checkpoint", c.s.Checkpoint(c.Context(), id, owner, "charge", []byte("ch_1")))
	c.noErr("Release", c.s.Release(c.Context(), id, owner))
	c.noErr("re-sent Release", c.s.Release(c.Context(), id, owner))
	res := c.claim(id, c.req(newToken(), "fp"), idemstore.ClaimOK)
	if res.Fence != 2 || string(res.Checkpoints["charge"]) != "ch_1" {
		c.fail("claim after release: fence %d, checkpoints %q; want 2 and charge=ch_1", res.Fence, res.Checkpoints)
	}
}

func releaseByStranger(c *checker) {
	id := newID()
	c.claim(id, c.req(newToken(), "fp"), idemstore.ClaimOK)
	c.leaseLost("stranger Release", c.s.Release(c.Context(), id, newToken()))
	c.claim(id, c.req(newToken(), "fp"), idemstore.ClaimBusy)
	c.leaseLost("Release of an absent record", c.s.Release(c.Context(), newID(), newToken()))
}

func takeoverAfterLeaseExpiry(c *checker) {
	id, dead := newID(), newToken()
	c.claim(id, c.req(dead, "fp"), idemstore.ClaimOK)
	c.noErr("Checkpoint", c.s.Checkpoint(c.Context(), id, dead, "step", []byte("1")))
	c.claim(id, c.req(newToken(), "fp"), idemstore.ClaimBusy)
	c.advance(c.lease + c.lease/2)
	res := c.claim(id, c.req(newToken(), "fp"), idemstore.ClaimOK)
	if res.Fence != 2 || string(res.Checkpoints["step"]) != "1" {
		c.fail("takeover: fence %d, checkpoints %q; want 2 and step=1", res.Fence, res.Checkpoints)
	}
}

func heartbeat(c *checker) {
	id, owner := newID(), newToken()
	c.claim(id, c.req(owner, "fp"), idemstore.ClaimOK)
	for range 3 {
		c.advance(c.lease / 2)
		c.noErr("Heartbeat", c.s.Heartbeat(c.Context(), id, owner, c.lease))
	}
	// 1.5 leases have passed since the claim: only the heartbeat kept it.
	c.claim(id, c.req(newToken(), "fp"), idemstore.ClaimBusy)
	c.leaseLost("stranger Heartbeat", c.s.Heartbeat(c.Context(), id, newToken(), c.lease))
}

func checkpointReplaces(c *checker) {
	ctx := c.Context()
	id, owner := newID(), newToken()
	c.claim(id, c.req(owner, "fp"), idemstore.ClaimOK)
	c.noErr("Checkpoint", c.s.Checkpoint(ctx, id, owner, "a", []byte("1")))
	c.noErr("Checkpoint", c.s.Checkpoint(ctx, id, owner, "b", []byte("2")))
	c.noErr("Checkpoint", c.s.Checkpoint(ctx, id, owner, "a", []byte("3")))
	c.noErr("Release", c.s.Release(ctx, id, owner))
	res := c.claim(id, c.req(owner+"x", "fp"), idemstore.ClaimOK)
	if cp := res.Checkpoints; len(cp) != 2 || string(cp["a"]) != "3" || string(cp["b"]) != "2" {
		c.fail("checkpoints %q, want a=3 b=2", cp)
	}
	c.noErr("Complete", c.s.Complete(ctx, id, owner+"x", nil, time.Hour))
	c.leaseLost("Checkpoint after Complete", c.s.Checkpoint(ctx, id, owner+"x", "c", nil))
}

func checkpointBinary(c *checker) {
	id, owner := newID(), newToken()
	c.claim(id, c.req(owner, "fp"), idemstore.ClaimOK)
	odd := map[string][]byte{"x:|1": []byte("4:ab|\x00\xff:"), "empty": {}, "12:": []byte("::")}
	for k, v := range odd {
		c.noErr("Checkpoint", c.s.Checkpoint(c.Context(), id, owner, k, v))
	}
	c.noErr("Release", c.s.Release(c.Context(), id, owner))
	res := c.claim(id, c.req(newToken(), "fp"), idemstore.ClaimOK)
	for k, v := range odd {
		if string(res.Checkpoints[k]) != string(v) {
			c.fail("checkpoint %q = %q, want %q", k, res.Checkpoints[k], v)
		}
	}
}

func readAbsent(c *checker) {
	if r := c.read(newID()); r != nil {
		c.fail("Read of an absent id: %+v, want nil", r)
	}
}

func ttls(c *checker) {
	id, owner := newID(), newToken()
	r := c.req(owner, "fp")
	c.claim(id, r, idemstore.ClaimOK)
	rec := c.stored(id)
	if rec.TTL <= 0 || rec.TTL > r.TTL || rec.LeaseTTL <= 0 || rec.LeaseTTL > c.lease {
		c.fail("in progress: TTL %v (want in (0, %v]), lease TTL %v (want in (0, %v])", rec.TTL, r.TTL, rec.LeaseTTL, c.lease)
	}
	c.noErr("Complete", c.s.Complete(c.Context(), id, owner, []byte("x"), 2*time.Hour))
	if rec = c.stored(id); rec.TTL <= time.Hour || rec.TTL > 2*time.Hour {
		c.fail("completed: TTL %v, want the retention, 2h", rec.TTL)
	}
}

func writesKeepTTL(c *checker) {
	id, owner := newID(), newToken()
	r := c.req(owner, "fp")
	r.TTL = 10 * time.Hour
	c.claim(id, r, idemstore.ClaimOK)
	first := c.stored(id).TTL
	c.noErr("Checkpoint", c.s.Checkpoint(c.Context(), id, owner, "a", []byte("1")))
	afterCheckpoint := c.stored(id).TTL
	c.noErr("Release", c.s.Release(c.Context(), id, owner))
	afterRelease := c.stored(id).TTL
	for _, ttl := range []time.Duration{afterCheckpoint, afterRelease} {
		if ttl <= 0 || ttl > first || ttl < first-time.Minute {
			c.fail("TTL %v after a write, want the claim's %v, kept", ttl, first)
		}
	}
}
