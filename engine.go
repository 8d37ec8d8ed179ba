package idem

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/wire"
)

// op names one logical operation: a key of a kind and a scope, and the
// fingerprint of the request it stands for.
type op struct {
	kind  Kind
	scope string
	key   string
	fp    print128
	// detach runs fn on a context without the caller's cancellation: the
	// claim and any wait still end with the caller's context, fn does not.
	detach bool
	// wait is how long a duplicate waits for the holder's result (WithWait).
	wait time.Duration
	// obs is the operation's report to the Guard's Observer, or nil.
	obs *observation
	// retention, when positive, is kept by the op's records instead of the
	// Guard's retention (WithRouteRetention).
	retention time.Duration
}

// runFunc is what the engine runs as the owner of a claim. It returns the
// payload to store and whether to store it; false releases the claim, so
// that the next attempt runs again. The function's own error, if it has
// one, stays with its caller (Do, Once, the middleware), which combines it
// with the engine's by joinErrors.
type runFunc func(ctx context.Context, a *Attempt) (payload []byte, keep bool)

// outcome is what exec did, as singleflight's call is what a caller of Do
// gets: a stored payload replayed, or the payload of a run of fn.
type outcome struct {
	payload  []byte // the stored payload, or the one fn returned
	replayed bool   // a stored result: fn did not run
	ran      bool   // fn ran (it may have panicked past exec instead)
	stored   bool   // fn's payload was stored
	lost     bool   // the lease was lost while fn ran
	left     bool   // fn abandoned the attempt: neither stored nor released
	pending  bool   // fn's payload is being stored in the background
}

// resultFunc turns what exec did, out, and the engine's error err into the
// result of exec's caller (Do, Once, the middleware): it decodes or sends a
// replayed payload, or joins fn's own error with err. It returns the error
// the caller reports, and whether a replayed payload could not be read
// back.
type resultFunc func(out outcome, err error) (rerr error, unreadable bool)

// exec is the engine under Do, Once and the HTTP middleware: it runs the
// operation o (see claimAndRun) and hands what happened to result, whose
// error it returns. It reports the operation to the Guard's Observer: it
// starts the operation before the claim (unless o.obs holds one its caller
// started: the middleware refuses some requests before there is an
// operation to run), runs fn under the context the Observer returned, and
// ends it with the outcome and result's error. A panic in fn ends it as
// released and continues.
func (g *Guard) exec(ctx context.Context, o op, fn runFunc, result resultFunc) error {
	if o.obs == nil {
		ctx, o.obs = g.observe(ctx, o.kind)
	}
	ob := o.obs
	defer ob.abort() // a no-op once ended
	out, err := g.claimAndRun(ctx, o, fn)
	rerr, unreadable := result(out, err)
	if ob != nil {
		oc := outcomeOf(ctx, out, err)
		if unreadable {
			oc = OutcomeUnreadable
		}
		ob.end(oc, rerr)
	}
	return rerr
}

// observe starts an operation of kind for the Guard's Observer and returns
// its context: the one the Observer's Start returned, or ctx when there is
// no Observer.
func (g *Guard) observe(ctx context.Context, kind Kind) (context.Context, *observation) {
	if g == nil {
		return ctx, nil
	}
	return startObservation(ctx, g.observer, g.log, kind)
}

// claimAndRun runs the operation o. It validates the
// key, claims the operation (waiting per the op's wait while another attempt
// holds it) and returns a stored payload as replayed without running fn.
// Otherwise it runs fn under a renewed lease, then releases the claim (keep
// false) or stores the payload (compare-and-complete on a context detached
// from ctx). The error is the engine's: the store's or the lease's before fn
// ran (fn did not run), or ErrNotRecorded joined with the cause after. A
// panic in fn releases the claim (unless fn abandoned its attempt) and
// continues.
func (g *Guard) claimAndRun(ctx context.Context, o op, fn runFunc) (outcome, error) {
	if g == nil || g.store == nil {
		why := "the Guard has no store"
		if g != nil {
			why = g.unusable
		}
		return outcome{}, fmt.Errorf("%w: %s", ErrStoreUnavailable, why)
	}
	if err := wire.ValidKey(o.key); err != nil {
		return outcome{}, err
	}
	id, owner, fp := idAndToken(o)
	lease, end := g.leaseFor(ctx)
	req := idemstore.ClaimRequest{Owner: owner, Fingerprint: fp, Lease: lease, TTL: lease + g.retentionOf(o)}
	var deadline time.Time
	if o.wait > 0 {
		deadline = time.Now().Add(o.wait)
	}
	w := waiter{g: g, id: id, deadline: deadline}
	defer w.close()
	// A claim of id this Guard is still taking back: wait for it (a claim
	// sent now could become a second claim on its way, which a late copy
	// of the first could then outrun).
	if err := g.awaitTakeBack(ctx, id); err != nil {
		return outcome{}, err
	}
	for {
		t := o.obs.now()
		res, sent, err := g.claim(ctx, id, req)
		o.obs.storeSince(t)
		o.obs.claimed(id, res.Fence)
		if err != nil {
			if mayHaveRun(err) {
				// The claim may have run, or still run: take it back once
				// the store answers, so that the retry runs at once.
				g.takeBack(ctx, id, owner, sent.Add(lease))
			}
			return outcome{}, g.storeError(ctx, err)
		}
		switch res.Status {
		case idemstore.ClaimCompleted:
			return outcome{payload: res.Payload, replayed: true}, nil
		case idemstore.ClaimMismatch:
			return outcome{}, ErrMismatch
		case idemstore.ClaimOK:
			rctx := ctx
			if o.detach {
				rctx = context.WithoutCancel(ctx)
			}
			return g.run(rctx, o, id, owner, leaseTerms{lease: lease, end: end, sent: sent}, res, fn)
		case idemstore.ClaimUnreadable:
			return outcome{}, g.unreadableRecord(ctx, id)
		case idemstore.ClaimBusy:
			if !sent.Before(deadline) {
				return outcome{}, &InProgressError{RetryAfter: res.RetryAfter}
			}
			t := o.obs.now()
			err := w.wait(ctx, res.RetryAfter)
			o.obs.waitSince(t)
			if err != nil {
				return outcome{}, err
			}
		default:
			return outcome{}, fmt.Errorf("%w: claim returned unknown status %d", ErrStoreUnavailable, res.Status)
		}
	}
}

// claim sends one claim within the store timeout; see storeCall.
func (g *Guard) claim(ctx context.Context, id string, req idemstore.ClaimRequest) (idemstore.ClaimResult, time.Time, error) {
	if !g.inlineWrites {
		return storeCall(ctx, g, func(ctx context.Context) (idemstore.ClaimResult, error) {
			return g.store.Claim(ctx, id, req)
		})
	}
	c, err := g.beginCall(ctx, g.budget, false)
	if err != nil {
		return idemstore.ClaimResult{}, time.Time{}, err
	}
	res, err := g.store.Claim(c.ctx, id, req)
	return res, c.sent, g.endCall(&c, err)
}

// idAndToken returns the id of the operation o, a fresh owner token
// (newToken) and o's fingerprint as the store gets it, made in one
// allocation.
func idAndToken(o op) (id, owner, fp string) {
	var out [idLen + tokenLen + printLen]byte
	b := appendOperationID(out[:0], o.kind, o.scope, o.key)
	b = appendToken(b)
	b = base64.RawURLEncoding.AppendEncode(b, o.fp[:])
	s := string(b)
	return s[:idLen], s[idLen : idLen+tokenLen], s[idLen+tokenLen:]
}

// outcomeOf names how an operation ended, from what exec returned: out and
// the engine's error err (not fn's own), in ctx, the caller's context.
func outcomeOf(ctx context.Context, out outcome, err error) Outcome {
	if out.replayed {
		return OutcomeReplayed
	}
	if out.ran {
		switch {
		case out.lost || errors.Is(err, ErrLeaseLost):
			return OutcomeLeaseLost
		case out.left:
			return OutcomeAbandoned
		case out.pending:
			return OutcomeRecording
		case err != nil:
			return OutcomeNotRecorded
		case out.stored:
			return OutcomeExecuted
		}
		return OutcomeReleased
	}
	switch {
	case errors.Is(err, ErrInProgress):
		return OutcomeInProgress
	case errors.Is(err, ErrMismatch):
		return OutcomeMismatch
	case errors.Is(err, ErrInvalidKey):
		return OutcomeInvalidKey
	case errors.Is(err, ErrUnreadable):
		return OutcomeUnreadable
	case errors.Is(err, ErrStoreUnavailable):
		return OutcomeStoreUnavailable
	case ctx.Err() != nil:
		return OutcomeCanceled
	}
	return OutcomeStoreUnavailable
}

// waiter paces the claims of a duplicate waiting (WithWait) while another
// attempt holds the key. With a store that is a Watcher it is notified of
// completion or release and checks on its own only every 2s, or when
// the holder's lease runs out (an expiry notifies nobody); otherwise it
// polls after 25ms, then every 50ms.
type waiter struct {
	g        *Guard
	id       string
	deadline time.Time
	polls    int
	watched  bool // Watch was tried
	notify   <-chan struct{}
	stop     func()
}

// watchPoll is how often a notified waiter checks on its own, in case a
// notification was lost.
const watchPoll = 2 * time.Second

// wait returns when the next claim is due, or with an error when ctx ends.
func (w *waiter) wait(ctx context.Context, retryAfter time.Duration) error {
	if !w.watched {
		w.watched = true
		if st, ok := w.g.store.(idemstore.Watcher); ok {
			wctx, cancel := context.WithTimeout(ctx, w.g.budget)
			var err error
			w.notify, w.stop, err = st.Watch(wctx, w.id)
			cancel()
			if err == nil {
				return nil // watching: claim again at once, in case it completed meanwhile
			} else if ctx.Err() != nil {
				return fmt.Errorf("idem: waiting for the first attempt: %w", context.Cause(ctx))
			}
		}
	}
	d := 50 * time.Millisecond
	switch {
	case w.notify != nil:
		d = watchPoll
	case w.polls == 0:
		d = 25 * time.Millisecond
	}
	w.polls++
	d = min(d, max(retryAfter, time.Millisecond), max(time.Until(w.deadline), 0))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("idem: waiting for the first attempt: %w", context.Cause(ctx))
	case <-t.C:
	case <-w.notify:
	}
	return nil
}

// close ends the watch, if any.
func (w *waiter) close() {
	if w.stop != nil {
		w.stop()
	}
}

// run runs fn as the owner of the claim of o, with the lease terms lt.
func (g *Guard) run(ctx context.Context, o op, id, owner string, lt leaseTerms, res idemstore.ClaimResult, fn runFunc) (outcome, error) {
	t := o.obs.now()
	lt, err := g.confirmLease(ctx, id, owner, lt)
	if err != nil {
		// fn never ran: the claim is taken back, its fence not counted.
		g.takeBack(ctx, id, owner, lt.sent.Add(lt.lease))
	}
	o.obs.storeSince(t)
	if err != nil {
		return outcome{}, err
	}
	// The Attempt and the lease it runs under, in one allocation.
	st := &struct {
		a    Attempt
		hold leaseHold
	}{a: Attempt{Key: o.key, ID: id, Fence: res.Fence, store: g.store, saver: g, owner: owner, cps: res.Checkpoints}}
	a, hold := &st.a, &st.hold
	hctx := g.holdLease(ctx, hold, id, owner, lt)
	finished := false
	defer func() {
		if !finished { // fn panicked or called runtime.Goexit
			hold.stop()
			if a.abandoned.Load() { // an abandoned attempt keeps its claim
				o.obs.end(OutcomeAbandoned, nil)
			} else {
				g.giveUp(ctx, a, hold.valid)
			}
		}
	}()
	payload, keep := fn(hctx, a)
	finished = true
	hold.stop()
	out := outcome{payload: payload, ran: true, lost: errors.Is(context.Cause(hctx), ErrLeaseLost)}
	if a.abandoned.Load() {
		// Not known to have run or not: the claim stays until its lease
		// runs out, and the next attempt after that takes over.
		out.left = true
		g.log.WarnContext(ctx, "idem: attempt abandoned; the key stays in progress until its lease runs out", "event", "abandoned", "key", o.key, "id", id, "fence", res.Fence)
		return out, nil
	}
	t = o.obs.now()
	defer o.obs.storeSince(t)
	if !keep || a.released.Load() {
		g.giveUp(ctx, a, hold.valid)
		return out, nil
	}
	cerr := g.complete(ctx, a, payload, g.retentionOf(o), hold.valid)
	if cerr != nil {
		out.pending = errors.As(cerr, new(*pendingError))
		return out, cerr
	}
	out.stored = true
	return out, nil
}

// retentionOf returns how long the records of o are kept: its own retention
// (WithRouteRetention) or the Guard's.
func (g *Guard) retentionOf(o op) time.Duration {
	if o.retention > 0 {
		return o.retention
	}
	return g.retention
}

// joinErrors combines fn's own error with the engine's (ErrNotRecorded
// after fn ran), fn's first.
func joinErrors(ferr, err error) error {
	switch {
	case ferr == nil:
		return err
	case err == nil:
		return ferr
	}
	return errors.Join(ferr, err)
}

// storeError wraps a store failure as ErrStoreUnavailable, unless it was the
// caller's own context that ended, or a stored value that the Guard cannot
// read (ErrUnreadable, from WithSealer).
func (g *Guard) storeError(ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("idem: %w", context.Cause(ctx))
	case errors.Is(err, ErrStoreUnavailable), errors.Is(err, ErrUnreadable):
		return err
	}
	return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
}

// unreadableRecord reports a claim that found the record's fingerprint keyed
// with a key the Guard does not list (ClaimUnreadable), and logs it.
func (g *Guard) unreadableRecord(ctx context.Context, id string) error {
	ids := g.fingerprintKeyIDs
	g.log.ErrorContext(ctx, "idem: the record's fingerprint is keyed with a key this Guard does not list; the operation is refused and not run again",
		"event", "fingerprint_key_unlisted", "id", id, "keys", listedKeys(ids))
	return fmt.Errorf("%w: the record's fingerprint is keyed with a key this Guard does not list (this Guard's: %s)", ErrUnreadable, listedKeys(ids))
}
