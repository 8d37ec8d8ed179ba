package idem

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// Namespaces keep Do keys, Once ids and HTTP keys apart.
const (
	nsDo   byte = 'd'
	nsOnce byte = 'o'
	nsHTTP byte = 'h'
)

// op names one logical operation: a key in a namespace and a scope, and the
// fingerprint of the request it stands for.
type op struct {
	ns    byte
	scope string
	key   string
	fp    string
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

// id returns the operation's stable, opaque id: the first 128 bits of the
// SHA-256 of its namespace, scope and key, base64url encoded (22 characters).
// Hashing keeps any key out of another's key space and gives every Redis key
// of the operation one hash tag.
func (o op) id() string {
	var buf [128]byte
	b := append(buf[:0], o.ns)
	b = binary.BigEndian.AppendUint64(b, uint64(len(o.scope)))
	b = append(b, o.scope...)
	b = append(b, o.key...)
	sum := sha256.Sum256(b)
	return base64.RawURLEncoding.EncodeToString(sum[:16])
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
}

// exec is the engine under Do, Once and the HTTP middleware. It validates the
// key, claims the operation (waiting per the op's wait while another attempt
// holds it) and returns a stored payload as replayed without running fn.
// Otherwise it runs fn under a renewed lease, then releases the claim (keep
// false) or stores the payload (compare-and-complete on a context detached
// from ctx). The error is the engine's: the store's or the lease's before fn
// ran (fn did not run), or ErrNotRecorded joined with the cause after. A
// panic in fn releases the claim and continues.
func (g *Guard) exec(ctx context.Context, o op, fn runFunc) (outcome, error) {
	if g == nil || g.store == nil {
		why := "the Guard has no store"
		if g != nil {
			why = g.unusable
		}
		return outcome{}, fmt.Errorf("%w: %s", ErrStoreUnavailable, why)
	}
	if err := validKey(o.key); err != nil {
		return outcome{}, err
	}
	id := o.id()
	owner := newToken()
	req := idemstore.ClaimRequest{Owner: owner, Fingerprint: o.fp, Lease: g.lease, TTL: g.lease + g.retentionOf(o)}
	var deadline time.Time
	if o.wait > 0 {
		deadline = time.Now().Add(o.wait)
	}
	w := waiter{g: g, id: id, deadline: deadline}
	defer w.close()
	for {
		sent := time.Now()
		res, err := g.store.Claim(ctx, id, req)
		o.obs.storeSince(sent)
		o.obs.claimed(id, res.Fence)
		if err != nil {
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
			return g.run(rctx, o, id, owner, sent, res, fn)
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
			var err error
			if w.notify, w.stop, err = st.Watch(ctx, w.id); err == nil {
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

// run runs fn as the owner of the claim of o, sent at claimed.
func (g *Guard) run(ctx context.Context, o op, id, owner string, claimed time.Time, res idemstore.ClaimResult, fn runFunc) (outcome, error) {
	t := o.obs.now()
	claimed, err := g.confirmLease(ctx, id, owner, claimed)
	o.obs.storeSince(t)
	if err != nil {
		return outcome{}, err
	}
	// The Attempt and the lease it runs under, in one allocation.
	st := &struct {
		a    Attempt
		hold leaseHold
	}{a: Attempt{Key: o.key, ID: id, Fence: res.Fence, store: g.store, owner: owner, cps: res.Checkpoints}}
	a, hold := &st.a, &st.hold
	hctx := g.holdLease(ctx, hold, id, owner, claimed)
	finished := false
	defer func() {
		if !finished { // fn panicked or called runtime.Goexit
			hold.stop()
			g.release(ctx, id, owner)
		}
	}()
	payload, keep := fn(hctx, a)
	finished = true
	hold.stop()
	out := outcome{payload: payload, ran: true, lost: errors.Is(context.Cause(hctx), ErrLeaseLost)}
	t = o.obs.now()
	defer o.obs.storeSince(t)
	if !keep {
		g.release(ctx, id, owner)
		return out, nil
	}
	cerr := g.bounded(ctx, func(ctx context.Context) error {
		return g.store.Complete(ctx, id, owner, payload, g.retentionOf(o))
	})
	if cerr != nil {
		if !errors.Is(cerr, ErrLeaseLost) {
			cerr = fmt.Errorf("%w: %w", ErrStoreUnavailable, cerr)
		}
		g.log.ErrorContext(ctx, "idem: result not recorded", "event", "result_not_recorded", "key", o.key, "id", id, "fence", res.Fence, "err", cerr)
		return out, errors.Join(ErrNotRecorded, cerr)
	}
	out.stored = true
	return out, nil
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

// release gives up a claim so that the next attempt runs again. Failures are
// logged: the claim then lasts until its lease expires.
func (g *Guard) release(ctx context.Context, id, owner string) {
	err := g.bounded(ctx, func(ctx context.Context) error { return g.store.Release(ctx, id, owner) })
	if err != nil && !errors.Is(err, ErrLeaseLost) {
		g.log.WarnContext(ctx, "idem: release failed; the key stays claimed until its lease expires", "event", "release_failed", "id", id, "err", err)
	}
}

// errWriteTimeout reports a store write that did not answer within the
// Guard's write timeout.
var errWriteTimeout = errors.New("idem: the store did not answer within the write timeout")

// bounded runs a store write detached from ctx's cancellation and waits for
// it at most the write timeout (WithWriteTimeout). The call gets a context
// with that deadline. A store whose client returns by the deadline (a
// RedisStore on a go-redis client with ContextTimeoutEnabled) is called on
// the caller's goroutine. Another may ignore it (go-redis does unless
// ContextTimeoutEnabled is set): the call then runs on a goroutine of its
// own, which is left to finish within the client's own timeouts when the
// deadline passes, and bounded reports errWriteTimeout.
func (g *Guard) bounded(ctx context.Context, f func(ctx context.Context) error) error {
	if ctx.Done() != nil {
		ctx = context.WithoutCancel(ctx)
	}
	if g.inlineWrites {
		wctx, cancel := context.WithTimeout(ctx, g.write)
		defer cancel()
		err := f(wctx)
		if err != nil && wctx.Err() != nil {
			return fmt.Errorf("%w: %w", errWriteTimeout, err)
		}
		return err
	}
	w := &boundedWrite{f: f}
	w.ctx, w.cancel = context.WithTimeout(ctx, g.write)
	go w.run()
	<-w.ctx.Done() // the write's end cancels it too
	if w.done.Load() {
		return w.err
	}
	return errWriteTimeout
}

// boundedWrite is a store write run by bounded.
type boundedWrite struct {
	f      func(ctx context.Context) error
	ctx    context.Context
	cancel context.CancelFunc
	err    error
	done   atomic.Bool // err is set
}

func (w *boundedWrite) run() {
	w.err = w.f(w.ctx)
	w.done.Store(true)
	w.cancel()
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
