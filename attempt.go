package idem

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/idemkit/idem/idemstore"
)

// Attempt describes one run of an operation's function. The function gets it
// as its second argument (the HTTP middleware: from AttemptFrom).
type Attempt struct {
	// Key is the caller's key.
	Key string
	// ID is the stable, opaque id of the operation (scope and key), equal
	// in every attempt: 22 characters of base64url (A-Z, a-z, 0-9, - and _).
	// Pass it to an external provider as that provider's idempotency key, so
	// that a repeated call is a duplicate there too.
	ID string
	// Fence is 1 on the first attempt and grows on every takeover or re-run
	// while the record lives. Fence > 1 means that an earlier attempt
	// started and did not complete: reconcile with external systems (ask
	// the provider about ID) before repeating a side effect. Downstream
	// systems may also reject writes carrying a fence lower than one they
	// have seen (a fencing token).
	Fence int64

	store idemstore.Store
	saver checkpointSaver // the Guard that runs the attempt; nil on an Attempt idem did not create
	owner string

	mu  sync.Mutex
	cps map[string][]byte

	abandoned atomic.Bool
	released  atomic.Bool
}

// Abandon says that this attempt's outcome is not known: its side effect
// may or may not have happened, as when a request to another system was
// sent and no answer came back. When the function (or the handler) returns,
// idem neither stores its result nor releases the claim; it stops renewing
// the lease, so the operation stays in progress until the lease runs out,
// as if its holder had crashed. Repeats meanwhile get ErrInProgress (409,
// or they wait under WithWait); the first one after that takes the key over
// as the next attempt, Fence+1, with the checkpoints, and should reconcile
// (ask the other system about ID) before repeating the side effect.
//
// Releasing instead would let a retry run the effect again at once;
// storing would answer every retry with a failure that may not have
// happened. Do returns the function's value and error as they are; the
// middleware sends the handler's response without storing it. Abandon is
// safe to call from any goroutine, more than once; on a nil Attempt it does
// nothing. An abandoned attempt keeps its claim even if the function then
// panics (a proxy's handler that aborts a response whose upstream broke off).
func (a *Attempt) Abandon() {
	if a != nil {
		a.abandoned.Store(true)
	}
}

// Release says that this attempt did nothing: its side effect is known not
// to have happened, as when the request to another system could not be
// sent. When the function (or the handler) returns, idem does not store its
// result, whatever it is, and releases the claim, so that a retry runs at
// once as the next attempt (Fence+1). Under the middleware the handler's
// response is sent without being stored even when WithCacheStatus would
// store its status: a gateway's 502 for an upstream it could not reach must
// not be replayed.
//
// Abandon wins over Release: an attempt that called both keeps its claim.
// Release is safe to call from any goroutine, more than once; on a nil
// Attempt it does nothing.
func (a *Attempt) Release() {
	if a != nil {
		a.released.Store(true)
	}
}

// maxCheckpointName is the longest checkpoint name accepted.
const maxCheckpointName = 255

// Checkpoint saves value under name on the operation's record, replacing an
// earlier value of that name, so that an attempt taking over after this one
// crashed sees it in Checkpoints. Use it to record progress on external
// systems, e.g. the provider's charge id once the charge is made.
//
// It returns ErrLeaseLost when another attempt took the key over, and
// ErrStoreUnavailable when the store could not be reached. On an Attempt
// that idem did not create (a zero Attempt in a test) it returns an error.
func (a *Attempt) Checkpoint(ctx context.Context, name string, value []byte) error {
	if a == nil || a.store == nil {
		return errors.New("idem: Checkpoint on an Attempt that idem did not create; in tests, use idemtest.NewGuard or idemtest.NewAttemptGuard")
	}
	if name == "" || len(name) > maxCheckpointName {
		return fmt.Errorf("idem: checkpoint name must be 1 to %d bytes, got %d", maxCheckpointName, len(name))
	}
	if cause := context.Cause(ctx); errors.Is(cause, ErrLeaseLost) {
		return cause // the heartbeat found the lease taken: no need to ask
	}
	if err := a.checkpoint(ctx, name, value); err != nil {
		switch {
		case errors.Is(err, ErrLeaseLost):
			return err
		case ctx.Err() != nil:
			return fmt.Errorf("idem: checkpoint: %w", context.Cause(ctx))
		}
		return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cps == nil {
		a.cps = make(map[string][]byte)
	}
	a.cps[name] = append([]byte(nil), value...)
	return nil
}

// checkpointSaver saves an attempt's checkpoints: the Guard, which bounds
// each by its store timeout and fail-fast.
type checkpointSaver interface {
	saveCheckpoint(ctx context.Context, a *Attempt, name string, value []byte) error
}

// checkpoint saves the value through the Guard that runs the attempt.
func (a *Attempt) checkpoint(ctx context.Context, name string, value []byte) error {
	if a.saver == nil {
		return a.store.Checkpoint(ctx, a.ID, a.owner, name, value)
	}
	return a.saver.saveCheckpoint(ctx, a, name, value)
}

// Checkpoints returns a copy of the checkpoints saved by earlier attempts and
// this one.
func (a *Attempt) Checkpoints() map[string][]byte {
	if a == nil {
		return map[string][]byte{}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string][]byte, len(a.cps))
	maps.Copy(out, a.cps)
	return out
}

type attemptContextKey struct{}

// ContextWithAttempt returns a copy of ctx that carries a, for AttemptFrom.
// The middleware does this for its handler; an adapter that runs a handler
// under Do (a gRPC interceptor, a message consumer) does it with the
// Attempt Do gave it.
func ContextWithAttempt(ctx context.Context, a *Attempt) context.Context {
	return context.WithValue(ctx, attemptContextKey{}, a)
}

// AttemptFrom returns the Attempt carried by ctx (a request under
// Middleware, or a context made by ContextWithAttempt), and reports whether
// there is one: outside them it returns nil and false, so check ok. Use
// Attempt.ID as the idempotency key towards external providers, and check
// Attempt.Fence before repeating a side effect.
func AttemptFrom(ctx context.Context) (*Attempt, bool) {
	if ctx == nil {
		return nil, false
	}
	a, ok := ctx.Value(attemptContextKey{}).(*Attempt)
	return a, ok && a != nil
}
