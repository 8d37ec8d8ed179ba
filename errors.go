package idem

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/wire"
)

// Errors returned by the library. Test for them with errors.Is.
var (
	// ErrInProgress reports that another attempt holds a live lease on the key.
	// The error is an *InProgressError carrying the lease's remaining time.
	ErrInProgress = errors.New("idem: operation in progress")

	// ErrMismatch reports that the key was first used with a different request.
	ErrMismatch = errors.New("idem: key reused with a different request")

	// ErrLeaseLost reports that the caller no longer owns the key: its lease
	// expired and another attempt took the key over. It is
	// idemstore.ErrLeaseLost, which stores return.
	ErrLeaseLost = idemstore.ErrLeaseLost

	// ErrInvalidKey reports a key (or Once id) that is empty, longer than 255
	// bytes, or not printable ASCII.
	ErrInvalidKey = wire.ErrInvalidKey

	// ErrStoreUnavailable reports that the store could not be reached. Unless it
	// is joined with ErrNotRecorded, the function was not run. It is
	// idemstore.ErrStoreUnavailable.
	ErrStoreUnavailable = idemstore.ErrStoreUnavailable

	// ErrNotRecorded reports that the function ran but its result could not be
	// stored. It is joined with ErrLeaseLost or ErrStoreUnavailable, and the
	// function's value is returned alongside it.
	ErrNotRecorded = errors.New("idem: result not recorded")

	// ErrUnreadable reports that the operation has a stored value (a result,
	// a response or a checkpoint) that the Guard cannot read back: it does
	// not open under the Guard's Sealer (sealed with a key no longer listed,
	// altered, or copied from another operation), or the record's
	// fingerprint is keyed with a key the Guard does not list. The function
	// was not run: the record says that it ran, or started, before.
	ErrUnreadable = errors.New("idem: stored value unreadable")

	// ErrPermanent marks an error made by Permanent, both when the function
	// returns it and when a repeat replays it.
	ErrPermanent = errors.New("idem: permanent error")
)

// InProgressError is the error returned while another attempt holds a live
// lease on the key. It matches ErrInProgress under errors.Is.
type InProgressError struct {
	// RetryAfter is the remaining time of the holder's lease: the earliest
	// moment a retry could take the key over.
	RetryAfter time.Duration
}

// Error implements error.
func (e *InProgressError) Error() string {
	return fmt.Sprintf("idem: operation in progress, retry after %v", e.RetryAfter)
}

// Is reports whether target is ErrInProgress.
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// Permanent marks err as the final outcome of an operation: Do and Once store
// it like a result, and every repeat of the key gets an error with the same
// message instead of running the function again. Both err's wrapper and its
// replay satisfy errors.Is(e, ErrPermanent). Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string        { return e.err.Error() }
func (e *permanentError) Unwrap() error        { return e.err }
func (e *permanentError) Is(target error) bool { return target == ErrPermanent }

// errWriteTimeout reports a store call that did not answer within the
// Guard's store timeout (or, for a completion, its write timeout).
var errWriteTimeout = errors.New("idem: the store did not answer in time")
