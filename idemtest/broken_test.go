package idemtest

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// The stores below are a MemoryStore with one defect each, the kind a store
// written against the contract could have. Run must fail against every one
// of them (TestRunCatchesBrokenStores); each override is the defect, and
// every method it does not override is the MemoryStore's own.

// doubleExecution never reports busy: a second caller of a running
// operation is told to run it too.
type doubleExecution struct{ *MemoryStore }

func (s doubleExecution) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	res, err := s.MemoryStore.Claim(ctx, id, c)
	if res.Status == idemstore.ClaimBusy {
		return idemstore.ClaimResult{Status: idemstore.ClaimOK, Fence: 1}, err
	}
	return res, err
}

// lostCompletion acknowledges a Complete without storing it.
type lostCompletion struct{ *MemoryStore }

func (lostCompletion) Complete(context.Context, string, string, []byte, time.Duration) error {
	return nil
}

// staleOwner does not check owner tokens: every write goes to the record's
// current owner, whoever sends it.
type staleOwner struct{ *MemoryStore }

// current returns the owner of id's record, or owner when there is none.
func current(s *MemoryStore, id, owner string) string {
	if r, _ := s.Read(context.Background(), id); r != nil {
		return r.Owner
	}
	return owner
}

func (s staleOwner) Heartbeat(ctx context.Context, id, owner string, lease time.Duration) error {
	return s.MemoryStore.Heartbeat(ctx, id, current(s.MemoryStore, id, owner), lease)
}

func (s staleOwner) Checkpoint(ctx context.Context, id, owner, name string, value []byte) error {
	return s.MemoryStore.Checkpoint(ctx, id, current(s.MemoryStore, id, owner), name, value)
}

func (s staleOwner) Complete(ctx context.Context, id, owner string, payload []byte, retention time.Duration) error {
	return s.MemoryStore.Complete(ctx, id, current(s.MemoryStore, id, owner), payload, retention)
}

func (s staleOwner) Release(ctx context.Context, id, owner string) error {
	return s.MemoryStore.Release(ctx, id, current(s.MemoryStore, id, owner))
}

// strangerRelease lets anyone release a lease.
type strangerRelease struct{ *MemoryStore }

func (s strangerRelease) Release(ctx context.Context, id, owner string) error {
	return s.MemoryStore.Release(ctx, id, current(s.MemoryStore, id, owner))
}

// ignoredFingerprint stores and compares no fingerprint: another request
// under the same key replays the first one's result.
type ignoredFingerprint struct{ *MemoryStore }

func (s ignoredFingerprint) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	c.Fingerprint, c.OtherFingerprints = "", nil
	return s.MemoryStore.Claim(ctx, id, c)
}

// completedIgnoresFingerprint compares fingerprints only while the
// operation runs.
type completedIgnoresFingerprint struct{ *MemoryStore }

func (s completedIgnoresFingerprint) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	if r, _ := s.Read(ctx, id); r != nil && r.State == idemstore.StateCompleted {
		return idemstore.ClaimResult{Status: idemstore.ClaimCompleted, Fence: r.Fence, Payload: r.Payload}, nil
	}
	return s.MemoryStore.Claim(ctx, id, c)
}

// plainFingerprints compares fingerprints as plain strings: it knows no
// keyed fingerprints, nor the other keys a caller lists.
type plainFingerprints struct{ *MemoryStore }

func (s plainFingerprints) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	if r, _ := s.Read(ctx, id); r != nil && r.Fingerprint != c.Fingerprint {
		return idemstore.ClaimResult{Status: idemstore.ClaimMismatch, Fence: r.Fence}, nil
	}
	return s.MemoryStore.Claim(ctx, id, c)
}

// fenceFromZero numbers attempts from 0.
type fenceFromZero struct{ *MemoryStore }

func (s fenceFromZero) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	res, err := s.MemoryStore.Claim(ctx, id, c)
	res.Fence--
	return res, err
}

// fenceNotKept restarts the fence at 1 on every claim: a takeover cannot
// tell it is not the first attempt.
type fenceNotKept struct{ *MemoryStore }

func (s fenceNotKept) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	res, err := s.MemoryStore.Claim(ctx, id, c)
	res.Fence = min(res.Fence, 1)
	return res, err
}

// fenceCountsClaims counts every granted claim as an attempt, a re-sent one
// too.
type fenceCountsClaims struct {
	*MemoryStore
	mu     sync.Mutex
	claims map[string]int64
}

func (s *fenceCountsClaims) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	res, err := s.MemoryStore.Claim(ctx, id, c)
	if res.Status == idemstore.ClaimOK {
		s.mu.Lock()
		s.claims[id]++
		res.Fence = s.claims[id]
		s.mu.Unlock()
	}
	return res, err
}

// busyForever reports busy with no time to wait.
type busyForever struct{ *MemoryStore }

func (s busyForever) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	res, err := s.MemoryStore.Claim(ctx, id, c)
	res.RetryAfter = 0
	return res, err
}

// lostCheckpoints acknowledges checkpoints without storing them.
type lostCheckpoints struct{ *MemoryStore }

func (lostCheckpoints) Checkpoint(context.Context, string, string, string, []byte) error { return nil }

// checkpointAfterComplete accepts a checkpoint on a completed record.
type checkpointAfterComplete struct{ *MemoryStore }

func (s checkpointAfterComplete) Checkpoint(ctx context.Context, id, owner, name string, value []byte) error {
	if r, _ := s.Read(ctx, id); r != nil && r.State == idemstore.StateCompleted {
		return nil
	}
	return s.MemoryStore.Checkpoint(ctx, id, owner, name, value)
}

// separatorValues cuts checkpoint values at the first '|', as a store that
// joins fields with a separator it does not escape would.
type separatorValues struct{ *MemoryStore }

func (s separatorValues) Checkpoint(ctx context.Context, id, owner, name string, value []byte) error {
	value, _, _ = bytes.Cut(value, []byte("|"))
	return s.MemoryStore.Checkpoint(ctx, id, owner, name, value)
}

// cStringPayloads cuts payloads at the first NUL byte.
type cStringPayloads struct{ *MemoryStore }

func (s cStringPayloads) Complete(ctx context.Context, id, owner string, payload []byte, retention time.Duration) error {
	payload, _, _ = bytes.Cut(payload, []byte{0})
	return s.MemoryStore.Complete(ctx, id, owner, payload, retention)
}

// completeOnce refuses a re-sent Complete of a completed record.
type completeOnce struct{ *MemoryStore }

func (s completeOnce) Complete(ctx context.Context, id, owner string, payload []byte, retention time.Duration) error {
	if r, _ := s.Read(ctx, id); r != nil && r.State == idemstore.StateCompleted {
		return idem.ErrLeaseLost
	}
	return s.MemoryStore.Complete(ctx, id, owner, payload, retention)
}

// fixedRetention keeps every completed record one hour, whatever the
// retention asked.
type fixedRetention struct{ *MemoryStore }

func (s fixedRetention) Complete(ctx context.Context, id, owner string, payload []byte, _ time.Duration) error {
	return s.MemoryStore.Complete(ctx, id, owner, payload, time.Hour)
}

// lostHeartbeats acknowledges heartbeats without renewing the lease.
type lostHeartbeats struct{ *MemoryStore }

func (lostHeartbeats) Heartbeat(context.Context, string, string, time.Duration) error { return nil }

// forgetfulRelease deletes the record on Release, fence and checkpoints
// with it: ids released once are served by a fresh record.
type forgetfulRelease struct {
	*MemoryStore
	mu      sync.Mutex
	renamed map[string]string
}

func (s *forgetfulRelease) id(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n, ok := s.renamed[id]; ok {
		return n
	}
	return id
}

func (s *forgetfulRelease) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	return s.MemoryStore.Claim(ctx, s.id(id), c)
}

func (s *forgetfulRelease) Checkpoint(ctx context.Context, id, owner, name string, value []byte) error {
	return s.MemoryStore.Checkpoint(ctx, s.id(id), owner, name, value)
}

func (s *forgetfulRelease) Complete(ctx context.Context, id, owner string, payload []byte, retention time.Duration) error {
	return s.MemoryStore.Complete(ctx, s.id(id), owner, payload, retention)
}

func (s *forgetfulRelease) Heartbeat(ctx context.Context, id, owner string, lease time.Duration) error {
	return s.MemoryStore.Heartbeat(ctx, s.id(id), owner, lease)
}

func (s *forgetfulRelease) Read(ctx context.Context, id string) (*idemstore.Record, error) {
	return s.MemoryStore.Read(ctx, s.id(id))
}

func (s *forgetfulRelease) Release(ctx context.Context, id, owner string) error {
	if err := s.MemoryStore.Release(ctx, s.id(id), owner); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.renamed[id] = s.renamed[id] + "+"
	return nil
}

// readFix reports what fix makes of the records it reads: TTLs a store
// keeps wrong, or a lease it does not see.
type readFix struct {
	*MemoryStore
	fix func(r *idemstore.Record)
}

func (s readFix) Read(ctx context.Context, id string) (*idemstore.Record, error) {
	r, err := s.MemoryStore.Read(ctx, id)
	if r != nil {
		s.fix(r)
	}
	return r, err
}

// growingTTL pushes a record's expiry an hour further at every checkpoint
// and release.
type growingTTL struct {
	*MemoryStore
	mu     sync.Mutex
	writes map[string]int
}

func (s *growingTTL) Checkpoint(ctx context.Context, id, owner, name string, value []byte) error {
	s.wrote(id)
	return s.MemoryStore.Checkpoint(ctx, id, owner, name, value)
}

func (s *growingTTL) Release(ctx context.Context, id, owner string) error {
	s.wrote(id)
	return s.MemoryStore.Release(ctx, id, owner)
}

func (s *growingTTL) wrote(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes[id]++
}

func (s *growingTTL) Read(ctx context.Context, id string) (*idemstore.Record, error) {
	r, err := s.MemoryStore.Read(ctx, id)
	if r != nil {
		s.mu.Lock()
		r.TTL += time.Duration(s.writes[id]) * time.Hour
		s.mu.Unlock()
	}
	return r, err
}

// doubleLease holds every lease twice as long as asked.
type doubleLease struct{ *MemoryStore }

func (s doubleLease) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	c.Lease *= 2
	return s.MemoryStore.Claim(ctx, id, c)
}

// coarseClock is a correct store that keeps time to a tenth of a second: a
// TTL read back, or a wait, is rounded up to the tenth, so that right after
// a write it is exactly what was asked (the checks ask for whole tenths).
type coarseClock struct{ *MemoryStore }

func ceilTenth(d time.Duration) time.Duration {
	const tenth = 100 * time.Millisecond
	return (d + tenth - 1).Truncate(tenth)
}

func (s coarseClock) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	res, err := s.MemoryStore.Claim(ctx, id, c)
	res.RetryAfter = ceilTenth(res.RetryAfter)
	return res, err
}

func (s coarseClock) Read(ctx context.Context, id string) (*idemstore.Record, error) {
	r, err := s.MemoryStore.Read(ctx, id)
	if r != nil {
		r.TTL, r.LeaseTTL = ceilTenth(r.TTL), ceilTenth(r.LeaseTTL)
	}
	return r, err
}

// emptyRead returns an empty record, not nil, for an absent id.
type emptyRead struct{ *MemoryStore }

func (s emptyRead) Read(ctx context.Context, id string) (*idemstore.Record, error) {
	if r, err := s.MemoryStore.Read(ctx, id); r != nil || err != nil {
		return r, err
	}
	return &idemstore.Record{}, nil
}

// unavailable fails every call, as a store that cannot be reached.
type unavailable struct{}

var errDown = errors.New("store down")

func (unavailable) Claim(context.Context, string, idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	return idemstore.ClaimResult{}, errDown
}
func (unavailable) Heartbeat(context.Context, string, string, time.Duration) error   { return errDown }
func (unavailable) Checkpoint(context.Context, string, string, string, []byte) error { return errDown }
func (unavailable) Complete(context.Context, string, string, []byte, time.Duration) error {
	return errDown
}
func (unavailable) Release(context.Context, string, string) error           { return errDown }
func (unavailable) Read(context.Context, string) (*idemstore.Record, error) { return nil, errDown }

// writeOnly is a correct store that does not implement idemstore.Reader.
type writeOnly struct{ idemstore.Store }
