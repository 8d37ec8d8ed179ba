package idemstore

import (
	"context"
	"time"
)

// Store keeps the records of operations. idem.RedisStore is the
// implementation; the interface exists so that tests can wrap a store to
// inject faults, and so that package idemtest can check any implementation
// against the contract.
//
// Every method must be safe for concurrent use. Each is one atomic step on
// one record, addressed by the operation's id (Attempt.ID), and must be
// idempotent for its owner token: running it twice, as a client that re-sends
// a command whose reply was lost does, reports the same outcome as once.
// Methods return ErrLeaseLost when the caller does not own the record; any
// other error means the store could not be reached or failed, and the engine
// reports it as ErrStoreUnavailable.
//
// A store that can also read records back implements Reader; package
// idemtest then checks what it stored. A store that can tell a waiting
// duplicate when an operation ends implements Watcher.
type Store interface {
	// Claim claims the operation for c.Owner, or reports why not: the
	// record is completed (its payload), busy (another owner's live lease),
	// or holds another fingerprint. A claim of an absent record starts at
	// fence 1; taking over an unfinished record whose lease is gone adds one
	// to its fence and keeps its checkpoints. A claim by the record's own
	// owner reports ClaimOK again.
	Claim(ctx context.Context, id string, c ClaimRequest) (ClaimResult, error)

	// Heartbeat renews owner's lease for another lease.
	Heartbeat(ctx context.Context, id, owner string, lease time.Duration) error

	// Checkpoint saves a named value on owner's unfinished record.
	Checkpoint(ctx context.Context, id, owner, name string, value []byte) error

	// Complete stores payload and marks the record completed, kept for
	// retention, if owner still owns it; then it drops owner's lease.
	Complete(ctx context.Context, id, owner string, payload []byte, retention time.Duration) error

	// Release drops owner's lease, keeping the record's fence, checkpoints
	// and TTL, so that the next claim takes over.
	Release(ctx context.Context, id, owner string) error
}

// Unclaimer is implemented by stores that can take a claim back: undo a
// claim whose attempt never acted, so that the next attempt gets the fence
// this one had (Attempt.Fence counts the attempts that may have acted). The
// engine calls it for a claim whose answer never came (it may still reach
// the store later), a claim whose lease could not be confirmed, and an
// attempt that called Attempt.Release; a store without it gets Release.
type Unclaimer interface {
	// Unclaim drops owner's claim as Release does and takes back its
	// fence: the record's fence goes back by one (a record the claim
	// created, with no checkpoints, is deleted). Once it returned nil, a
	// claim of owner that reaches the store within lease must be refused
	// (reported busy), since it may be a copy of the claim still on its
	// way. Unclaim of a record owner does not hold changes no record; it
	// returns nil, or an error when it cannot refuse a late copy yet (a
	// store that keeps the refusal beside the lease, while another owner
	// holds it). The engine calls Unclaim again until it returns nil, or
	// until the lease the claim would have set has ended.
	Unclaim(ctx context.Context, id, owner string, lease time.Duration) error
}

// DeadlineAware is implemented by a store that knows whether its calls
// return by their context's deadline. The engine bounds every store call by
// its store timeout (idem.WithStoreTimeout): a store whose calls return by
// the deadline is called on the caller's goroutine, any other on a
// goroutine of its own, which the caller stops waiting for at the timeout.
type DeadlineAware interface {
	// ReturnsByDeadline reports whether every call of the store returns
	// by its context's deadline, and when its context is cancelled.
	ReturnsByDeadline() bool
}

// Reader is implemented by stores that can read a record back, for tests
// and operators; the engine never reads a record apart from a claim.
type Reader interface {
	// Read returns the record, or nil when there is none.
	Read(ctx context.Context, id string) (*Record, error)
}

// ClaimRequest is the input of Store.Claim.
type ClaimRequest struct {
	Owner       string        // fresh token of the claiming attempt
	Fingerprint string        // fingerprint of the request
	Lease       time.Duration // lease to take
	TTL         time.Duration // lifetime of an unfinished record: lease + retention

	// OtherFingerprints are, for a Guard with a Sealer that keys
	// fingerprints (idem.WithSealer), the request's fingerprint keyed with each
	// listed key but the current one. A record stored under one of them is
	// this request, written before a key rotation. Nil without a Sealer.
	// Stores compare fingerprints with MatchFingerprint.
	OtherFingerprints []string
}

// ClaimStatus is the outcome of Store.Claim.
type ClaimStatus int

// Outcomes of a claim.
const (
	ClaimOK        ClaimStatus = iota + 1 // the caller owns the operation
	ClaimCompleted                        // the operation is completed: replay Payload
	ClaimBusy                             // another owner holds a live lease for RetryAfter
	ClaimMismatch                         // the record holds another fingerprint
	// ClaimUnreadable: the record's fingerprint is keyed with a key the
	// caller does not list (see ClaimRequest.MatchFingerprint), so it can
	// be neither verified nor opened. The engine reports idem.ErrUnreadable.
	ClaimUnreadable
)

// String returns the outcome's name.
func (s ClaimStatus) String() string {
	switch s {
	case ClaimOK:
		return "claimed"
	case ClaimCompleted:
		return "completed"
	case ClaimBusy:
		return "busy"
	case ClaimMismatch:
		return "mismatch"
	case ClaimUnreadable:
		return "unreadable"
	}
	return "unknown"
}

// ClaimResult is the output of Store.Claim. Only the fields of its Status
// are set.
type ClaimResult struct {
	Status      ClaimStatus
	Fence       int64             // ClaimOK: the attempt's fence; ClaimCompleted, ClaimMismatch: the record's (0 if unknown)
	Checkpoints map[string][]byte // ClaimOK: checkpoints of earlier attempts
	Payload     []byte            // ClaimCompleted: the stored payload
	RetryAfter  time.Duration     // ClaimBusy: remaining time of the holder's lease
}

// State is the state of a stored record.
type State int

// Record states. A record whose lease is gone is still StateInProgress: the
// next claim takes it over.
const (
	StateInProgress State = iota + 1
	StateCompleted
)

// String returns the state's name.
func (s State) String() string {
	switch s {
	case StateInProgress:
		return "IN_PROGRESS"
	case StateCompleted:
		return "COMPLETED"
	}
	return "UNKNOWN"
}

// Record is a stored operation, as returned by Reader.Read.
type Record struct {
	State       State
	Fence       int64
	Owner       string
	Fingerprint string
	Checkpoints map[string][]byte // unfinished records only
	Payload     []byte            // completed records only
	Created     time.Time         // the first claim of the record, to the second
	TTL         time.Duration     // remaining lifetime of the record
	LeaseTTL    time.Duration     // remaining lease, 0 when there is none
}
