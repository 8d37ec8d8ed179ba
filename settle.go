package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// How an attempt's claim ends once fn returned, or without fn: completed
// (its result stored), released (fn failed: the next attempt runs again,
// Fence+1) or taken back (fn never acted: the next attempt gets the same
// Fence). Each write waits at most the write timeout (the store timeout by
// default), then goes on in the background until the store answers or the
// lease it is about ends (background.go).

// writeKind is what a settling write does.
type writeKind uint8

const (
	writeComplete writeKind = iota // Store.Complete
	writeRelease                   // Store.Release
	writeTakeBack                  // idemstore.Unclaimer's Unclaim, else Release
)

// settleWrite is one settling write of an operation's claim, a value that
// a background retry copies.
type settleWrite struct {
	kind      writeKind
	id, owner string
	payload   []byte        // writeComplete: fn's payload
	retention time.Duration // writeComplete: how long the result is kept
	lease     time.Duration // writeTakeBack: how long a copy of the claim is refused
	key       string        // for the log
	fence     int64         // for the log
	// tracked: a take-back gone on in the background, counted in the
	// Guard's takingBack until it ends, for a repeat of the key to wait for.
	tracked bool
	// unclaim: a take-back on a store that is an idemstore.Unclaimer;
	// without one it is a release.
	unclaim bool
}

// do runs the write once on st.
func (w *settleWrite) do(ctx context.Context, st idemstore.Store) error {
	switch w.kind {
	case writeComplete:
		return st.Complete(ctx, w.id, w.owner, w.payload, w.retention)
	case writeTakeBack:
		if w.unclaim {
			return st.(idemstore.Unclaimer).Unclaim(ctx, w.id, w.owner, w.lease)
		}
	}
	return st.Release(ctx, w.id, w.owner)
}

// name is the write's name in the log.
func (w *settleWrite) name() string {
	switch w.kind {
	case writeComplete:
		return "completion"
	case writeTakeBack:
		return "take_back"
	}
	return "release"
}

// settled logs how a write that went on in the background ended.
func (g *Guard) settled(ctx context.Context, w *settleWrite, err error) {
	if w.tracked {
		g.takingBack.remove(w.id)
	}
	switch {
	case w.kind == writeComplete && err == nil:
		g.log.InfoContext(ctx, "idem: result recorded in the background", "event", "result_recorded_late", "key", w.key, "id", w.id, "fence", w.fence)
	case w.kind == writeComplete:
		g.log.ErrorContext(ctx, "idem: result not recorded", "event", "result_not_recorded", "key", w.key, "id", w.id, "fence", w.fence, "err", err)
	case err != nil && !errors.Is(err, ErrLeaseLost):
		g.log.WarnContext(ctx, "idem: "+w.name()+" failed; the key stays claimed until its lease expires", "event", w.name()+"_failed", "id", w.id, "err", err)
	}
}

// complete stores fn's payload as the result of a's operation, kept for
// retention; until is when a's lease ends by its own clock. It returns nil when stored, else
// ErrNotRecorded joined with the cause: ErrLeaseLost, or
// ErrStoreUnavailable (wrapping a *pendingError while the completion goes
// on in the background).
func (g *Guard) complete(ctx context.Context, a *Attempt, payload []byte, retention time.Duration, until time.Time) error {
	w := settleWrite{kind: writeComplete, id: a.ID, owner: a.owner, payload: payload, retention: retention, key: a.Key, fence: a.Fence}
	err := g.settle(ctx, w, until)
	var pe *pendingError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pe):
		g.log.WarnContext(ctx, "idem: the result was not stored within the store timeout; storing it goes on in the background", "event", "result_pending", "key", a.Key, "id", a.ID, "fence", a.Fence, "err", pe.first)
	default:
		g.settled(ctx, &w, err)
		if errors.Is(err, ErrLeaseLost) {
			return errors.Join(ErrNotRecorded, err)
		}
	}
	return errors.Join(ErrNotRecorded, fmt.Errorf("%w: %w", ErrStoreUnavailable, err))
}

// giveUp gives up a's claim once fn returned without a result to store:
// taken back when a was released (Attempt.Release: it did nothing),
// released otherwise. until is when a's lease ends by its own clock.
func (g *Guard) giveUp(ctx context.Context, a *Attempt, until time.Time) {
	if a.released.Load() {
		g.takeBack(ctx, a.ID, a.owner, until)
		return
	}
	g.release(ctx, a.ID, a.owner, until)
}

// release gives up a claim so that the next attempt runs again; see
// settle. Failures are logged: the claim then lasts until its lease
// expires.
func (g *Guard) release(ctx context.Context, id, owner string, until time.Time) {
	w := settleWrite{kind: writeRelease, id: id, owner: owner}
	if err := g.settle(ctx, w, until); !errors.As(err, new(*pendingError)) {
		g.settled(ctx, &w, err)
	}
}

// takeBack undoes a claim whose attempt never acted: its answer never
// came, its lease could not be confirmed, or the attempt was released
// (Attempt.Release). With a store that can (idemstore.Unclaimer) the next
// attempt gets the fence this one had, and a copy of the claim still on its
// way to the store is refused; with another store it is a release. It goes
// on in the background until the store answers, or until.
func (g *Guard) takeBack(ctx context.Context, id, owner string, until time.Time) {
	_, unclaim := g.store.(idemstore.Unclaimer)
	w := settleWrite{kind: writeTakeBack, id: id, owner: owner, lease: g.lease, unclaim: unclaim}
	if err := g.settle(ctx, w, until); !errors.As(err, new(*pendingError)) {
		g.settled(ctx, &w, err)
	}
}

// awaitTakeBack waits, at most the store timeout, for the take-backs of
// id that go on in the background, if any: a repeat of a key whose claim
// this Guard is taking back claims once they are done, rather than find the
// key busy with a claim nobody runs, or send a second claim that could meet
// the same fate. It returns ErrStoreUnavailable when they did not end in
// time, and at once while the store is failing (fail-fast): the key is held
// by a claim of this Guard's that the store has not let go of yet, so the
// repeat is refused as the store's (503), not as another attempt's (409).
func (g *Guard) awaitTakeBack(ctx context.Context, id string) error {
	ended := g.takingBack.ended(id)
	if ended == nil {
		return nil
	}
	if g.health.failing() {
		// The take-back cannot end before the store answers again: the
		// repeat is refused at once, as fail-fast refuses any request.
		return fmt.Errorf("%w: an earlier claim of this key, whose answer never came, is still being taken back, and the store's calls keep failing", ErrStoreUnavailable)
	}
	t := time.NewTimer(g.budget)
	defer t.Stop()
	select {
	case <-ended:
		return nil
	case <-t.C:
		return fmt.Errorf("%w: an earlier claim of this key, whose answer never came, is still being taken back", ErrStoreUnavailable)
	case <-ctx.Done():
		return fmt.Errorf("idem: %w", context.Cause(ctx))
	}
}

// settle runs the write w within the write timeout, detached from ctx's
// cancellation. A write that fail-fast refused or that the store did not
// answer goes on in the background until the store answers or until, and
// settle returns a *pendingError wrapping its first error.
func (g *Guard) settle(ctx context.Context, w settleWrite, until time.Time) error {
	err := g.writeOnce(ctx, g.write, w)
	if w.settledBy(err) {
		return err
	}
	if w.kind == writeTakeBack {
		g.takingBack.add(w.id)
		w.tracked = true
	}
	g.later(ctx, w, until)
	return &pendingError{first: err}
}

// settledBy reports whether the write w, which returned err, is done: an
// Unclaim once it succeeded (until then a copy of the claim may still take
// the key), another write, a release among them, once the store answered:
// a release that finds no claim of its owner is as done as one that ended
// it.
func (w *settleWrite) settledBy(err error) bool {
	switch {
	case err == nil:
		return true
	case w.unclaim:
		return false
	}
	return classify(err) == callAnswered
}

// writeOnce runs w once, detached from ctx's cancellation, if fail-fast
// lets it go out, waiting at most d.
func (g *Guard) writeOnce(ctx context.Context, d time.Duration, w settleWrite) error {
	if !g.inlineWrites {
		probe, err := g.health.admit()
		if err != nil {
			return err
		}
		sent := time.Now()
		_, err = callWithin(ctx, g, d, true, func(ctx context.Context) (struct{}, error) { return struct{}{}, w.do(ctx, g.store) })
		g.health.report(probe, sent, endOf(context.Background(), err), err, g.budget)
		return err
	}
	c, err := g.beginCall(ctx, d, true)
	if err != nil {
		return err
	}
	return g.endCall(&c, w.do(c.ctx, g.store))
}

// Store writes that outlive their request: a completion, a release or the
// take-back of an unanswered claim that did not answer within the store
// timeout goes on in the background, tried again until the store answers
// or the lease it is about would have ended. Drain waits for them.

// Drain waits until the store writes the Guard goes on with in the
// background are done, or ctx ends (then it returns ctx's cause). A
// completion or a release that did not answer within the store timeout
// (WithStoreTimeout), and the take-back of a claim whose answer never came,
// are tried again in the background until the store answers or the lease
// they are about would have ended. Call Drain before a process exits (after
// http.Server.Shutdown), or before an AWS Lambda handler returns, so that a
// result the client got is stored. It is safe to call at any time, from
// any goroutine.
func (g *Guard) Drain(ctx context.Context) error {
	if g == nil {
		return nil
	}
	idle := g.pending.wait()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Pacing of background writes: the first try again after retryFirst, then
// twice as long each time, up to retryMax.
const (
	retryFirst = 10 * time.Millisecond
	retryMax   = 200 * time.Millisecond
)

// later goes on with the write w in the background: it tries it again
// until the store answers or until passes, and logs how it ended.
func (g *Guard) later(ctx context.Context, w settleWrite, until time.Time) {
	g.pending.add()
	go g.retry(context.WithoutCancel(ctx), w, until)
}

// retry tries w again until the store answers or until passes, pausing
// retryFirst, then twice as long each time up to retryMax, or until a
// failing store answers again.
func (g *Guard) retry(ctx context.Context, w settleWrite, until time.Time) {
	defer g.pending.done()
	delay := retryFirst
	t := time.NewTimer(delay)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-g.health.answered(): // nil, and never ready, unless failing
		}
		err := g.writeOnce(ctx, g.budget, w)
		if w.settledBy(err) || !time.Now().Before(until) {
			g.settled(ctx, &w, err)
			return
		}
		delay = min(2*delay, retryMax)
		t.Reset(min(delay, max(time.Until(until), 0)))
	}
}

// pendingError reports a write that did not answer in time and goes on in
// the background.
type pendingError struct{ first error }

func (e *pendingError) Error() string {
	return "idem: the store did not answer in time; the write goes on in the background: " + e.first.Error()
}

func (e *pendingError) Unwrap() error { return e.first }
