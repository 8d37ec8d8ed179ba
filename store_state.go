package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// StoreState is a Guard's view of its store, as fail-fast keeps it (see
// WithStoreTimeout): whether new operations go to the store or are refused
// at once. Its values are stable: use them as metric labels.
type StoreState string

// States of a store.
const (
	// StoreOK: calls go to the store.
	StoreOK StoreState = "ok"
	// StoreFailing: the store's calls kept failing (timeouts, refused or
	// broken connections); new operations are refused at once with
	// ErrStoreUnavailable until a probe succeeds.
	StoreFailing StoreState = "failing"
)

// StoreStateObserver is implemented by an Observer (WithObserver) that
// wants to know when its Guard's store starts failing and when it answers
// again. StoreStateChanged is called once per change, after it happened,
// with the new state and, for StoreFailing, the last failure. Guards that
// share a RedisStore share its state, and each one's Observer is told.
type StoreStateObserver interface {
	StoreStateChanged(s StoreState, err error)
}

// Fail fast: a store whose calls keep failing is refused at once, as a
// circuit breaker does (closed, open, half-open with one probe at a time).
const (
	// failRun is how many failures in a row make the store failing.
	failRun = 3
	// probeEvery is how long a failing store is left alone after a failed
	// probe before the next call is let through as a probe.
	probeEvery = 100 * time.Millisecond
)

// storeHealth keeps whether a store's calls are failing. A call asks admit
// first and reports how it ended with report. The store fails when
// failRun calls in a row failed, or when a call failed that was sent a
// whole budget after the first of the failures in a row (it did not
// answer for as long as any caller may wait); one answer ends it. While it
// fails, admit refuses every call but one every probeEvery, the probe.
type storeHealth struct {
	open  atomic.Bool  // the store is failing
	fails atomic.Int32 // failures in a row (read without the lock on the hot path)

	mu        sync.Mutex
	runStart  time.Time // when the first failure in a row was sent
	since     time.Time // when the store started failing
	nextProbe time.Time
	probing   bool
	last      error         // the last failure
	back      chan struct{} // closed when the store answers after failures
	watchers  []func(StoreState, error)
	log       *slog.Logger
}

func newStoreHealth() *storeHealth { return &storeHealth{back: make(chan struct{})} }

// failing reports whether the store is failing.
func (h *storeHealth) failing() bool { return h.open.Load() }

// answered returns a channel closed when the store, whose last calls
// failed, answers again: nil when the last call was answered.
func (h *storeHealth) answered() <-chan struct{} {
	if h.fails.Load() == 0 && !h.open.Load() {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fails.Load() == 0 && !h.open.Load() {
		return nil
	}
	return h.back
}

// watch adds f to the functions told of every change of state.
func (h *storeHealth) watch(f func(StoreState, error)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.watchers = append(h.watchers, f)
}

// failingError is the refusal of a call to a failing store.
type failingError struct {
	since time.Duration // how long the store has been failing
	last  error         // its last failure
}

func (e *failingError) Error() string {
	return fmt.Sprintf("idem: store unavailable: its calls keep failing (for %v), so calls are refused at once until one answers: %v",
		e.since.Round(time.Millisecond), e.last)
}

func (e *failingError) Unwrap() error { return ErrStoreUnavailable }

// notSentError is the error of a store call that did not go out because
// its caller's context had ended: nothing is to be taken back.
type notSentError struct{ err error }

func (e notSentError) Error() string { return e.err.Error() }
func (e notSentError) Unwrap() error { return e.err }

// admit reports whether a call may go to the store: nil, and probe set
// when the call is the one probe of a failing store; a *failingError when
// the store is failing and the call is refused.
func (h *storeHealth) admit() (probe bool, err error) {
	if !h.open.Load() {
		return false, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch now := time.Now(); {
	case !h.open.Load():
		return false, nil
	case h.probing || now.Before(h.nextProbe):
		return false, &failingError{since: now.Sub(h.since), last: h.last}
	}
	h.probing = true
	return true, nil
}

// callEnd is how a store call ended, for report.
type callEnd int

const (
	callAnswered callEnd = iota // the store answered, whatever it said
	callFailed                  // the store did not answer (timeout, connection)
	callDropped                 // neither: the caller left, or the call never went out
)

// report tells h how a call it admitted (a probe if probe) ended: sent at
// sent, by end, with err; budget is how long its caller waits for a call.
func (h *storeHealth) report(probe bool, sent time.Time, end callEnd, err error, budget time.Duration) {
	if end == callAnswered && !probe && h.fails.Load() == 0 && !h.open.Load() {
		return // the hot path: answered, and nothing to undo
	}
	h.mu.Lock()
	if probe {
		h.probing = false
	}
	var changed bool
	switch end {
	case callAnswered:
		if h.fails.Load() > 0 || h.open.Load() {
			close(h.back) // wake the writes waiting in the background
			h.back = make(chan struct{})
		}
		h.fails.Store(0)
		h.runStart = time.Time{}
		if h.open.Load() {
			h.open.Store(false)
			changed = true
		}
	case callFailed:
		n := h.fails.Add(1)
		if h.runStart.IsZero() || sent.Before(h.runStart) {
			h.runStart = sent
		}
		h.last = err
		now := time.Now()
		h.nextProbe = now.Add(probeEvery)
		if !h.open.Load() && (n >= failRun || sent.Sub(h.runStart) >= budget || now.Sub(h.runStart) >= budget) {
			h.open.Store(true)
			h.since = now
			changed = true
		}
	}
	state, last, watchers, log := StoreOK, h.last, h.watchers, h.log
	if h.open.Load() {
		state = StoreFailing
	}
	h.mu.Unlock()
	if changed {
		h.told(state, last, watchers, log)
	}
}

// told tells the watchers and the log of a change to state.
func (h *storeHealth) told(state StoreState, last error, watchers []func(StoreState, error), log *slog.Logger) {
	if log != nil {
		if state == StoreFailing {
			log.Warn("idem: the store's calls keep failing; new operations are refused at once until one answers", "event", "store_failing", "err", last)
		} else {
			log.Info("idem: the store answers again", "event", "store_ok")
		}
	}
	var err error
	if state == StoreFailing {
		err = last
	}
	for _, f := range watchers {
		f(state, err)
	}
}

// healthStore is a store that keeps its health itself, so that every
// Guard over it shares one view (RedisStore does, and Check reads it).
type healthStore interface {
	storeHealth() *storeHealth
}

// endOf classifies how a store call that returned err ended, for report;
// ctx is the caller's context.
func endOf(ctx context.Context, err error) callEnd {
	switch {
	case err == nil:
		return callAnswered
	case ctx.Err() != nil:
		return callDropped
	}
	return classify(err)
}

// classify tells how a store call that failed with err ended, for
// fail-fast: the store answered (a refusal such as ErrLeaseLost, a script's
// error), did not answer (a timeout, a refused or broken connection, a
// server that is loading or has lost its master), or neither (the call was
// refused before it went out).
func classify(err error) callEnd {
	var fe *failingError
	var rerr redis.Error
	var ae answeredError
	var again *tryAgainError
	switch {
	case errors.As(err, &fe):
		return callDropped
	case errors.Is(err, ErrLeaseLost), errors.Is(err, ErrUnreadable), errors.As(err, &ae), errors.As(err, &again):
		return callAnswered
	case errors.Is(err, errWriteTimeout), errors.Is(err, context.DeadlineExceeded):
		return callFailed
	case errors.As(err, &rerr):
		for _, p := range outagePrefixes {
			if strings.HasPrefix(rerr.Error(), p) {
				return callFailed
			}
		}
		return callAnswered
	case errors.Is(err, ErrStoreUnavailable):
		// A store that cannot work at all (a nil client, a Ring, a sealer's
		// bad key) or too few replicas: it is not down, it is refused.
		return callDropped
	}
	return callFailed
}

// tryAgainError is a store's answer that asks for its write to be tried
// again later (settle does): the store answered, and is not failing.
type tryAgainError struct{ msg string }

func (e *tryAgainError) Error() string { return e.msg }

// answeredError is an error of a store that answered, and undid what the
// call did (a RedisStore's write that too few replicas acknowledged).
type answeredError interface {
	error
	answeredByStore()
}

// outagePrefixes are the error replies of a server that cannot serve now,
// though it answers: loading its data, cut off from its master or cluster,
// or busy with a script.
var outagePrefixes = []string{"LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "BUSY ", "READONLY"}

// mayHaveRun reports whether a store call that failed with err may still
// have run, or still run, on the server: it was (or may have been) sent,
// and its reply never came. A call refused by fail-fast, a connection that
// could not be made, a server's error reply and a store that cannot work
// did not run.
func mayHaveRun(err error) bool {
	var fe *failingError
	var rerr redis.Error
	var dial *net.OpError
	var ae answeredError
	switch {
	case err == nil:
		return false
	case errors.As(err, &fe), errors.As(err, &rerr):
		return false
	case errors.As(err, &ae): // the store undid it already
		return false
	case errors.As(err, new(notSentError)):
		return false
	case errors.As(err, &dial) && dial.Op == "dial":
		return false
	case errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrClosed):
		return false
	case errors.Is(err, ErrStoreUnavailable) && !errors.Is(err, errWriteTimeout):
		return false
	}
	return true
}
