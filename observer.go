package idem

import (
	"context"
	"log/slog"
	"time"
)

// Observer is told of the operations a Guard runs, for metrics and traces
// (contrib/idemotel is one). Set it with WithObserver.
//
// Every operation is started once and ended once: a call of Do or Once, or
// a request the middleware protects (one whose method needs a key; with
// WithOptionalKey, a request without a key is not an operation). The claims
// a waiting duplicate repeats are part of its one operation, not operations
// of their own. A panic in an Observer method is recovered and logged; it
// never reaches the caller or the request.
type Observer interface {
	// Start is called when an operation starts, before its claim. The
	// context it returns becomes the operation's: fn (or the handler) runs
	// under it and End gets it, so a span started here is the parent of the
	// spans fn creates. Return ctx to keep it.
	Start(ctx context.Context, kind Kind) context.Context

	// End is called once, when the operation ends: after fn's result was
	// stored or released, or after the operation was refused. ctx is the
	// context Start returned.
	End(ctx context.Context, e Event)
}

// Event describes an operation that ended, for an Observer.
type Event struct {
	Kind    Kind    // what ran the operation: Do, Once or the middleware
	Outcome Outcome // how it ended
	// ID is the operation's id (Attempt.ID): a hash of its kind, scope and
	// key, never the key itself. It is "" when the key was refused.
	ID string
	// Fence is the record's fence: the attempt's own when fn ran, the
	// stored record's on a replay or a mismatch; 0 when unknown.
	Fence int64
	// Duration is the whole operation; under the middleware, the whole
	// request inside it, refusals included.
	Duration time.Duration
	// Wait is the time a duplicate spent waiting for the first attempt
	// (WithWait, WithRouteWait); 0 when it did not wait.
	Wait time.Duration
	// Store is the time spent waiting for the store: claims, the
	// completion and the release, not the heartbeats that run beside fn.
	Store time.Duration
	// Err is the error the caller got, if any: the engine's or fn's.
	Err error
}

// Outcome is how an operation ended. Its values are stable: use them as
// metric labels.
type Outcome string

// Outcomes of an operation.
const (
	// OutcomeExecuted: fn (or the handler) ran and its result was stored.
	OutcomeExecuted Outcome = "executed"
	// OutcomeReplayed: the stored result of an earlier run was returned;
	// fn did not run.
	OutcomeReplayed Outcome = "replayed"
	// OutcomeInProgress: another attempt held the key (after waiting, if
	// the operation waited); fn did not run.
	OutcomeInProgress Outcome = "in_progress"
	// OutcomeMismatch: the key was used before with another request; fn did
	// not run.
	OutcomeMismatch Outcome = "mismatch"
	// OutcomeInvalidKey: the key was refused before a claim: empty, too
	// long or not printable ASCII; under the middleware also missing or
	// repeated, or the request could not be tied to one operation (no
	// scope, a body that could not be read). fn did not run.
	OutcomeInvalidKey Outcome = "invalid_key"
	// OutcomeTooLarge: the request body was larger than the middleware
	// accepts (413); the handler did not run.
	OutcomeTooLarge Outcome = "too_large"
	// OutcomeStoreUnavailable: the store failed or answered the claim too
	// late to trust its lease; fn did not run.
	OutcomeStoreUnavailable Outcome = "store_unavailable"
	// OutcomeCanceled: the caller's context ended before fn ran (during
	// the claim or a wait).
	OutcomeCanceled Outcome = "canceled"
	// OutcomeLeaseLost: the lease was lost while fn ran or at completion
	// (another attempt took over); fn's result was not stored.
	OutcomeLeaseLost Outcome = "lease_lost"
	// OutcomeNotRecorded: fn ran but its result could not be stored for
	// another reason (the store failed or did not answer in time).
	OutcomeNotRecorded Outcome = "not_recorded"
	// OutcomeRecording: fn ran, and the store did not answer the
	// completion of its result within the store timeout
	// (WithStoreTimeout): the caller got fn's result with ErrNotRecorded,
	// and storing it goes on in the background (Guard.Drain waits for it).
	OutcomeRecording Outcome = "recording"
	// OutcomeReleased: fn failed or panicked, or its response is one that
	// is not stored (a 5xx); the key is free again for a retry.
	OutcomeReleased Outcome = "released"
	// OutcomeAbandoned: fn (or the handler) called Attempt.Abandon: its
	// outcome is not known, so nothing was stored or released, and the key
	// stays in progress until the lease runs out.
	OutcomeAbandoned Outcome = "abandoned"
	// OutcomeUnreadable: a stored result exists but could not be read back
	// (it does not decode, or a Sealer could not open it or the record's
	// fingerprint: ErrUnreadable); fn did not run.
	OutcomeUnreadable Outcome = "unreadable"
)

// observation is one operation's report to the Guard's Observer; nil when
// the Guard has none, and every method is then a no-op.
type observation struct {
	observer Observer
	log      *slog.Logger
	ctx      context.Context
	start    time.Time
	ev       Event
	ended    bool
}

// startObservation starts an operation of kind for o and returns its
// context: the one o's Start returned. A nil Observer observes nothing: it
// returns ctx and a nil observation.
func startObservation(ctx context.Context, o Observer, log *slog.Logger, kind Kind) (context.Context, *observation) {
	if o == nil {
		return ctx, nil
	}
	ob := &observation{observer: o, log: log, ctx: ctx, start: time.Now(), ev: Event{Kind: kind}}
	ob.safely(func() {
		if c := o.Start(ctx, kind); c != nil {
			ob.ctx = c
		}
	})
	return ob.ctx, ob
}

// end ends the operation, once.
func (ob *observation) end(oc Outcome, err error) {
	if ob == nil || ob.ended {
		return
	}
	ob.ended = true
	ob.ev.Outcome, ob.ev.Err, ob.ev.Duration = oc, err, time.Since(ob.start)
	ob.safely(func() { ob.observer.End(ob.ctx, ob.ev) })
}

// abort ends an operation that fn's panic (or runtime.Goexit) left: the
// engine released its key.
func (ob *observation) abort() {
	ob.end(OutcomeReleased, nil)
}

// now returns the time when there is an Observer to tell, else the zero
// time: without one, the engine does not read the clock for it.
func (ob *observation) now() time.Time {
	if ob == nil {
		return time.Time{}
	}
	return time.Now()
}

// storeSince adds the time since t to the time spent on the store.
func (ob *observation) storeSince(t time.Time) {
	if ob != nil {
		ob.ev.Store += time.Since(t)
	}
}

// waitSince adds the time since t to the time spent waiting.
func (ob *observation) waitSince(t time.Time) {
	if ob != nil {
		ob.ev.Wait += time.Since(t)
	}
}

// claimed notes the operation's id and the record's fence.
func (ob *observation) claimed(id string, fence int64) {
	if ob != nil {
		ob.ev.ID, ob.ev.Fence = id, fence
	}
}

// safely calls f, logging instead of passing on its panic.
func (ob *observation) safely(f func()) {
	defer func() {
		if p := recover(); p != nil {
			ob.log.ErrorContext(ob.ctx, "idem: observer panicked", "event", "observer_panic", "panic", p)
		}
	}()
	f()
}
