package idemprom

import (
	"net/http"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/gateway"
)

// Outcome is the outcome label of a request: what became of it. Its values
// are stable.
type Outcome string

// Outcomes of a request.
const (
	// Executed: the request was sent to the handler (the upstream), which
	// answered; its response was stored, or released when its status is
	// one that is not stored (a 5xx).
	Executed Outcome = "executed"
	// Replayed: the stored response of an earlier request was sent.
	Replayed Outcome = "replayed"
	// InProgress: another request held the key (409 after any wait), or
	// the client gave up while waiting for it.
	InProgress Outcome = "in_progress"
	// Mismatch: the key was used before with another request (422).
	Mismatch Outcome = "mismatch"
	// StoreUnavailable: the store failed or did not answer in time, or was
	// refused at once while it keeps failing (503, nothing sent); or the
	// handler's response could not be recorded (sent, not stored: the log
	// says not_recorded or lease_lost), or a stored one could not be read.
	StoreUnavailable Outcome = "store_unavailable"
	// UpstreamFailed: the request was sent upstream and no complete answer
	// came back (502, or a response broken off): its outcome is unknown, and
	// the key stays in progress until its lease runs out.
	UpstreamFailed Outcome = "upstream_failed"
	// UpstreamUnreachable: the upstream could not be reached; the request
	// was not sent, and the key was released (502).
	UpstreamUnreachable Outcome = "upstream_unreachable"
	// UpstreamTimeout: the request was sent upstream and its answer did not
	// come in time (504): its outcome is unknown, as for UpstreamFailed.
	UpstreamTimeout Outcome = "upstream_timeout"
	// PassedThrough: the middleware did not take the request on (a method
	// that needs no key, or no key where keys are optional).
	PassedThrough Outcome = "passed_through"
	// KeyMissing: a key was needed and missing or invalid, or the request
	// could not be tied to one operation (a body that could not be read)
	// (400).
	KeyMissing Outcome = "key_missing"
	// ScopeMissing: the request had a key but no scope (500 scope-missing).
	ScopeMissing Outcome = "scope_missing"
	// TooLarge: the request body was larger than the middleware reads
	// (413).
	TooLarge Outcome = "too_large"
)

// Outcomes returns every Outcome, in the order of their documentation.
func Outcomes() []Outcome {
	return []Outcome{Executed, Replayed, InProgress, Mismatch, StoreUnavailable, UpstreamFailed,
		UpstreamUnreachable, UpstreamTimeout, PassedThrough, KeyMissing, ScopeMissing, TooLarge}
}

// outcomeOf returns the outcome of a request: the operation's event (nil:
// the middleware passed the request through), what the gateway reported of
// its upstream, and the status sent.
func outcomeOf(e *idem.Event, rep *gateway.Report, status int) Outcome {
	if e == nil {
		return PassedThrough
	}
	if f, ok := rep.Failure(); ok {
		switch f.Type {
		case gateway.ProblemUnreachable:
			return UpstreamUnreachable
		case gateway.ProblemTimeout:
			return UpstreamTimeout
		}
		return UpstreamFailed
	}
	switch e.Outcome {
	case idem.OutcomeExecuted, idem.OutcomeReleased:
		return Executed
	case idem.OutcomeReplayed:
		return Replayed
	case idem.OutcomeInProgress:
		return InProgress
	case idem.OutcomeMismatch:
		return Mismatch
	case idem.OutcomeAbandoned:
		return UpstreamFailed // the upstream answered, then broke off
	case idem.OutcomeTooLarge:
		return TooLarge
	case idem.OutcomeInvalidKey:
		if status == http.StatusInternalServerError {
			return ScopeMissing
		}
		return KeyMissing
	case idem.OutcomeCanceled:
		if e.Wait > 0 {
			return InProgress
		}
	}
	return StoreUnavailable // store_unavailable, not_recorded, lease_lost, unreadable, a claim cut short
}
