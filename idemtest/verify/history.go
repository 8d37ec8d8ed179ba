// Package verify records histories of idem operations and checks them
// against the guarantees idem makes.
//
// A History holds every call of Do (its key, request, start and end, whether
// and with which fence its function ran, what it returned), every effect
// offered to a fenced Sink, and the intervals during which a fault was
// active. Check reads a History once, in time linear in its size, and
// reports the violations of four invariants:
//
//   - I1: at most one effect per key is accepted by the sink;
//   - I2: every result handed to a caller equals every other result handed
//     out for that key (no divergent replay), and a fail-closed error
//     (ErrStoreUnavailable without ErrNotRecorded, ErrInvalidKey,
//     ErrMismatch) never comes from a call whose function ran;
//   - I3: no result handed to a caller is lost: no call that starts after it
//     was handed out runs the function again;
//   - I4: once the faults healed, every key completes or is free again
//     within lease + wait: a probe made then is not refused as in progress.
//
// Each violation names the key, the calls involved and the faults active at
// the time; where the fault is one of idem's documented limits (failover
// without replica acknowledgements, eviction, a restart without
// persistence, a crash with AOF everysec, which reaches only the writes
// of the seconds before it: Fault.Reach) the violation says so, and it
// still counts.
//
// Workload drives the same randomised traffic through a Guard for the
// fault tests, the long run and the idem verify command.
//
// Several processes share one History and one Sink through Handler, served
// by the process that holds them, and Remote in the others.
package verify

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/idemkit/idem"
)

// A Kind classifies what a call returned.
type Kind string

// The kinds of outcome of a call.
const (
	KindOK                   Kind = "ok"                      // a result, fresh or replayed
	KindPermanent            Kind = "permanent"               // a stored Permanent error, fresh or replayed
	KindInProgress           Kind = "in_progress"             // ErrInProgress
	KindMismatch             Kind = "mismatch"                // ErrMismatch
	KindInvalidKey           Kind = "invalid_key"             // ErrInvalidKey
	KindUnavailable          Kind = "store_unavailable"       // ErrStoreUnavailable: fn did not run
	KindNotRecordedLeaseLost Kind = "not_recorded_lease_lost" // ErrNotRecorded with ErrLeaseLost
	KindNotRecorded          Kind = "not_recorded"            // ErrNotRecorded with ErrStoreUnavailable
	KindLeaseLost            Kind = "lease_lost"              // ErrLeaseLost, nothing recorded
	KindUnreadable           Kind = "unreadable"              // ErrUnreadable
	KindCanceled             Kind = "canceled"                // the caller's context ended
	KindFailed               Kind = "failed"                  // fn's own error, the claim released
)

// Classify returns the kind of outcome of a call that returned err.
func Classify(err error) Kind {
	switch {
	case err == nil:
		return KindOK
	case errors.Is(err, idem.ErrNotRecorded) && errors.Is(err, idem.ErrLeaseLost):
		return KindNotRecordedLeaseLost
	case errors.Is(err, idem.ErrNotRecorded):
		return KindNotRecorded
	case errors.Is(err, idem.ErrPermanent):
		return KindPermanent
	case errors.Is(err, idem.ErrInProgress):
		return KindInProgress
	case errors.Is(err, idem.ErrMismatch):
		return KindMismatch
	case errors.Is(err, idem.ErrInvalidKey):
		return KindInvalidKey
	case errors.Is(err, idem.ErrStoreUnavailable):
		return KindUnavailable
	case errors.Is(err, idem.ErrLeaseLost):
		return KindLeaseLost
	case errors.Is(err, idem.ErrUnreadable):
		return KindUnreadable
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return KindCanceled
	}
	return KindFailed
}

// FailClosed reports whether k is an outcome that promises the function did
// not run.
func (k Kind) FailClosed() bool {
	return k == KindUnavailable || k == KindInvalidKey || k == KindMismatch
}

// Handed reports whether a call of kind k handed a stored outcome to its
// caller: a result or a permanent error, which every repeat must get too.
func (k Kind) Handed() bool { return k == KindOK || k == KindPermanent }

// A Call is one call of Do as the History recorded it. Times are offsets
// from the History's start.
type Call struct {
	ID      int
	Key     string
	Request string // the request's identity: calls with another one expect ErrMismatch
	Probe   bool   // a probe made after the faults healed (I4)
	Via     string // the entry point: "do", "http" or "once"; "" in planted histories
	Start   time.Duration
	End     time.Duration
	Ran     bool  // the function ran in this call
	Fence   int64 // Attempt.Fence when it ran
	Kind    Kind
	Result  string // what the caller got: the value, or the permanent error's message
}

// An Effect is one effect offered to a Sink.
type Effect struct {
	Key      string
	Fence    int64
	Value    string
	Call     int // the ID of the call whose function offered it
	At       time.Duration
	Accepted bool
}

// A Fault is an interval during which a fault was active.
type Fault struct {
	Name  string
	Limit string // the documented limit it exercises, or ""
	Start time.Duration
	End   time.Duration // -1 while active

	// Reach, when positive, bounds what the fault's limit can lose: the
	// writes acknowledged within Reach before Start, as a crash of a Redis
	// whose AOF is fsynced every second loses the writes it had not yet
	// written out. A violation is then attributed to the limit only when
	// it involves two calls or more, every one of them ended after
	// Start-Reach (or never), one began before End, and one ended after
	// Start (or never): something acknowledged in the window, missed after
	// the fault began. Any other violation during the fault still counts
	// as one outside the documented limits.
	Reach time.Duration
}

// The documented limits a fault may exercise.
const (
	LimitFailover = "failover without replica acknowledgements"
	LimitEviction = "eviction"
	LimitRestart  = "restart without persistence"
	// LimitAOFEverysec is a crash of a Redis with appendonly yes and
	// appendfsync everysec: Redis postpones writing its AOF buffer for up
	// to two seconds while a background fsync is slow, and a crash loses
	// what it postponed, acknowledged writes included. Give the fault a
	// Reach.
	LimitAOFEverysec = "crash with AOF appendfsync everysec"
)

// A History records calls, effects and faults. Its methods may be called
// from any goroutine.
type History struct {
	start  time.Time
	remote *remote // set by Remote: the calls are recorded by a Handler

	mu      sync.Mutex
	calls   []Call
	effects []Effect
	faults  []Fault
}

// NewHistory returns an empty History whose clock starts now.
func NewHistory() *History { return &History{start: time.Now()} }

// Now returns the time elapsed since the History started.
func (h *History) Now() time.Duration { return time.Since(h.start) }

// An Op is a call in progress, returned by Begin.
type Op struct {
	h  *History
	id int
}

// ID returns the call's ID in the History.
func (o *Op) ID() int { return o.id }

// Begin records the start of a call of Do with key and request.
func (h *History) Begin(key, request string, probe bool) *Op {
	return h.begin(key, request, probe, "")
}

// begin records the start of a call through the entry point via.
func (h *History) begin(key, request string, probe bool, via string) *Op {
	if h.remote != nil {
		m, ok := h.remote.do("begin", remoteMsg{Key: key, Request: request, Probe: probe, Via: via})
		if !ok {
			m.ID = -1
		}
		return &Op{h: h, id: m.ID}
	}
	now := h.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	id := len(h.calls)
	h.calls = append(h.calls, Call{ID: id, Key: key, Request: request, Probe: probe, Via: via, Start: now, End: -1})
	return &Op{h: h, id: id}
}

// has reports whether id is the ID of a call in h.
func (h *History) has(id int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return id >= 0 && id < len(h.calls)
}

// Ran records that the call's function started with fence.
func (o *Op) Ran(fence int64) {
	if o.h.remote != nil {
		if o.id >= 0 {
			o.h.remote.do("ran", remoteMsg{ID: o.id, Fence: fence})
		}
		return
	}
	o.h.mu.Lock()
	defer o.h.mu.Unlock()
	c := &o.h.calls[o.id]
	c.Ran, c.Fence = true, fence
}

// End records the call's return: the value it handed out (for a nil err)
// and its error.
func (o *Op) End(value string, err error) {
	now := o.h.Now()
	kind := Classify(err)
	if kind == KindPermanent {
		value = err.Error()
	}
	o.finish(now, kind, value)
}

// finish records the call's return at the time at, with its kind and what
// it handed out. A remote History records it at the server's time.
func (o *Op) finish(at time.Duration, kind Kind, value string) {
	if !kind.Handed() {
		value = ""
	}
	if o.h.remote != nil {
		if o.id >= 0 {
			o.h.remote.do("end", remoteMsg{ID: o.id, Kind: kind, Value: value})
		}
		return
	}
	o.h.mu.Lock()
	defer o.h.mu.Unlock()
	c := &o.h.calls[o.id]
	c.End, c.Kind, c.Result = at, kind, value
}

// StartFault records that a fault began; end records that it healed.
func (h *History) StartFault(name, limit string) (end func()) {
	now := h.Now()
	h.mu.Lock()
	i := len(h.faults)
	h.faults = append(h.faults, Fault{Name: name, Limit: limit, Start: now, End: -1})
	h.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			now := h.Now()
			h.mu.Lock()
			h.faults[i].End = now
			h.mu.Unlock()
		})
	}
}

// AddFault records a fault over an interval known afterwards.
func (h *History) AddFault(f Fault) {
	h.mu.Lock()
	h.faults = append(h.faults, f)
	h.mu.Unlock()
}

// AddCall records a finished call as it is, for planted histories; its ID
// is set to its index.
func (h *History) AddCall(c Call) {
	h.mu.Lock()
	c.ID = len(h.calls)
	h.calls = append(h.calls, c)
	h.mu.Unlock()
}

// AddEffect records an effect as it is, for planted histories.
func (h *History) AddEffect(e Effect) {
	h.mu.Lock()
	h.effects = append(h.effects, e)
	h.mu.Unlock()
}

// snapshot returns copies of the recorded calls, effects and faults.
func (h *History) snapshot() ([]Call, []Effect, []Fault) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Call(nil), h.calls...), append([]Effect(nil), h.effects...), append([]Fault(nil), h.faults...)
}

// Faults returns the faults recorded so far.
func (h *History) Faults() []Fault {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Fault(nil), h.faults...)
}

// Keys returns the distinct keys of the calls recorded, probes excluded, in
// the order of their first call.
func (h *History) Keys() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := make(map[string]bool)
	var keys []string
	for _, c := range h.calls {
		if !c.Probe && !seen[c.Key] {
			seen[c.Key] = true
			keys = append(keys, c.Key)
		}
	}
	return keys
}

// Len returns the number of calls and effects recorded.
func (h *History) Len() (calls, effects int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.calls), len(h.effects)
}
