package idemtest

import (
	"context"
	"maps"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// MemoryStore is an idemstore.Store that keeps its records in memory, for unit
// tests of code that uses idem: no Redis, no network, no goroutines. It
// follows the store contract (it passes Run) and implements
// idemstore.Reader, so a test can look at what was stored:
//
//	rec, _ := store.Read(ctx, idem.OperationID(idem.KindDo, "", key))
//
// Its clock is the wall clock plus what Advance added, so a test can let a
// lease or a record expire without sleeping. Records live in one process
// only: a MemoryStore is not shared between replicas and is not meant for
// production. Its methods are safe for concurrent use.
type MemoryStore struct {
	mu      sync.Mutex
	skew    time.Duration // added to the wall clock by Advance
	records map[string]*memRecord
	leases  map[string]memLease
	// refused are the claims Unclaim took back, by id and owner: a copy
	// of one that comes later is busy until then.
	refused map[[2]string]time.Time
}

// memRecord is one operation's record.
type memRecord struct {
	completed   bool
	fence       int64
	owner, fp   string
	created     time.Time
	checkpoints map[string][]byte // unfinished records
	payload     []byte            // completed records
	expires     time.Time
}

// memLease is one operation's lease.
type memLease struct {
	owner   string
	expires time.Time
}

var (
	_ idemstore.Store         = (*MemoryStore)(nil)
	_ idemstore.Reader        = (*MemoryStore)(nil)
	_ idemstore.Unclaimer     = (*MemoryStore)(nil)
	_ idemstore.DeadlineAware = (*MemoryStore)(nil)
)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{records: map[string]*memRecord{}, leases: map[string]memLease{}, refused: map[[2]string]time.Time{}}
}

// ReturnsByDeadline implements idemstore.DeadlineAware: every call answers at
// once, and none starts once its context ended.
func (s *MemoryStore) ReturnsByDeadline() bool { return true }

// Advance moves the store's clock forward by d: leases and records expire as
// if d had passed. A running attempt whose lease expires this way loses it at
// its next heartbeat, as a holder that froze would.
func (s *MemoryStore) Advance(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.skew += max(d, 0)
}

// lock locks the store and returns its current time, after dropping what
// expired.
func (s *MemoryStore) lock() time.Time {
	s.mu.Lock()
	now := time.Now().Add(s.skew)
	for id, r := range s.records {
		if !now.Before(r.expires) {
			delete(s.records, id)
		}
	}
	for id, l := range s.leases {
		if !now.Before(l.expires) {
			delete(s.leases, id)
		}
	}
	for k, until := range s.refused {
		if !now.Before(until) {
			delete(s.refused, k)
		}
	}
	return now
}

// Claim implements idemstore.Store.
func (s *MemoryStore) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return idemstore.ClaimResult{}, err
	}
	now := s.lock()
	defer s.mu.Unlock()
	r, l := s.records[id], s.leases[id]
	held := l.owner != ""
	if until, ok := s.refused[[2]string{id, c.Owner}]; ok {
		return idemstore.ClaimResult{Status: idemstore.ClaimBusy, RetryAfter: until.Sub(now)}, nil
	}
	switch {
	case r == nil && held:
		return idemstore.ClaimResult{Status: idemstore.ClaimBusy, RetryAfter: l.expires.Sub(now)}, nil
	case r == nil:
		r = &memRecord{fence: 1, created: now.Truncate(time.Second)}
		s.records[id] = r
	case c.MatchFingerprint(r.fp) != idemstore.ClaimOK:
		return idemstore.ClaimResult{Status: c.MatchFingerprint(r.fp), Fence: r.fence}, nil
	case r.completed:
		return idemstore.ClaimResult{Status: idemstore.ClaimCompleted, Fence: r.fence, Payload: clone(r.payload)}, nil
	case r.owner == c.Owner:
		// A re-sent claim: renew the lease, keep the record as it is. A
		// lease, when there is one, is always the record's owner's: only a
		// claim sets both, and a record is created only when no lease is held.
		s.leases[id] = memLease{owner: c.Owner, expires: now.Add(c.Lease)}
		return idemstore.ClaimResult{Status: idemstore.ClaimOK, Fence: r.fence, Checkpoints: cloneMap(r.checkpoints)}, nil
	case held:
		return idemstore.ClaimResult{Status: idemstore.ClaimBusy, RetryAfter: l.expires.Sub(now)}, nil
	default:
		r.fence++ // taking over an unfinished record whose lease is gone
	}
	r.owner, r.fp, r.expires = c.Owner, c.Fingerprint, now.Add(c.TTL)
	s.leases[id] = memLease{owner: c.Owner, expires: now.Add(c.Lease)}
	return idemstore.ClaimResult{Status: idemstore.ClaimOK, Fence: r.fence, Checkpoints: cloneMap(r.checkpoints)}, nil
}

// Heartbeat implements idemstore.Store.
func (s *MemoryStore) Heartbeat(ctx context.Context, id, owner string, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	now := s.lock()
	defer s.mu.Unlock()
	if l, ok := s.leases[id]; !ok || l.owner != owner {
		return idem.ErrLeaseLost
	}
	s.leases[id] = memLease{owner: owner, expires: now.Add(lease)}
	return nil
}

// Checkpoint implements idemstore.Store.
func (s *MemoryStore) Checkpoint(ctx context.Context, id, owner, name string, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.lock()
	defer s.mu.Unlock()
	r := s.records[id]
	if r == nil || r.completed || r.owner != owner {
		return idem.ErrLeaseLost
	}
	if r.checkpoints == nil {
		r.checkpoints = map[string][]byte{}
	}
	r.checkpoints[name] = clone(value)
	return nil
}

// Complete implements idemstore.Store.
func (s *MemoryStore) Complete(ctx context.Context, id, owner string, payload []byte, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	now := s.lock()
	defer s.mu.Unlock()
	r := s.records[id]
	if r == nil || r.owner != owner {
		return idem.ErrLeaseLost
	}
	if r.completed {
		return nil // a re-sent complete
	}
	r.completed, r.payload, r.checkpoints, r.expires = true, clone(payload), nil, now.Add(retention)
	delete(s.leases, id)
	return nil
}

// Release implements idemstore.Store.
func (s *MemoryStore) Release(ctx context.Context, id, owner string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.lock()
	defer s.mu.Unlock()
	r := s.records[id]
	if r == nil || r.completed || r.owner != owner {
		return idem.ErrLeaseLost
	}
	if s.leases[id].owner == owner {
		delete(s.leases, id)
	}
	return nil
}

// Unclaim implements idemstore.Unclaimer.
func (s *MemoryStore) Unclaim(ctx context.Context, id, owner string, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	now := s.lock()
	defer s.mu.Unlock()
	s.refused[[2]string{id, owner}] = now.Add(lease)
	r := s.records[id]
	if r == nil || r.completed || r.owner != owner {
		return nil
	}
	if s.leases[id].owner == owner {
		delete(s.leases, id)
	}
	r.fence--
	if r.fence == 0 && len(r.checkpoints) == 0 {
		delete(s.records, id)
	}
	return nil
}

// Read implements idemstore.Reader.
func (s *MemoryStore) Read(ctx context.Context, id string) (*idemstore.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now := s.lock()
	defer s.mu.Unlock()
	r := s.records[id]
	if r == nil {
		return nil, nil
	}
	rec := &idemstore.Record{State: idemstore.StateInProgress, Fence: r.fence, Owner: r.owner, Fingerprint: r.fp,
		Checkpoints: cloneMap(r.checkpoints), Created: r.created, TTL: r.expires.Sub(now)}
	if r.completed {
		rec.State, rec.Payload = idemstore.StateCompleted, clone(r.payload)
	}
	if l, ok := s.leases[id]; ok {
		rec.LeaseTTL = l.expires.Sub(now)
	}
	return rec, nil
}

func clone(b []byte) []byte { return append([]byte{}, b...) }

func cloneMap(m map[string][]byte) map[string][]byte {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string][]byte, len(m))
	for k, v := range maps.All(m) {
		out[k] = clone(v)
	}
	return out
}
