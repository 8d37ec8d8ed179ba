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
// Fence). Each write waits at most the store timeout, then goes on in the
// background (storeWrite).

// complete stores fn's payload as the result of a's operation o; until is
// when a's lease ends by its own clock. It returns nil when stored, else
// ErrNotRecorded joined with the cause: ErrLeaseLost, or
// ErrStoreUnavailable (wrapping a *pendingError while the completion goes
// on in the background).
func (g *Guard) complete(ctx context.Context, o op, a *Attempt, payload []byte, until time.Time) error {
	id, owner, retention := a.ID, a.owner, g.retentionOf(o)
	log := func(err error) {
		g.log.ErrorContext(ctx, "idem: result not recorded", "event", "result_not_recorded", "key", o.key, "id", id, "fence", a.Fence, "err", err)
	}
	err := g.storeWrite(ctx, g.write, until, func(ctx context.Context) error {
		return g.store.Complete(ctx, id, owner, payload, retention)
	}, func(err error) {
		if err == nil {
			g.log.InfoContext(ctx, "idem: result recorded in the background", "event", "result_recorded_late", "key", o.key, "id", id, "fence", a.Fence)
			return
		}
		log(err)
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrLeaseLost):
		log(err)
		return errors.Join(ErrNotRecorded, err)
	case errors.As(err, new(*pendingError)):
		g.log.WarnContext(ctx, "idem: the result was not stored within the store timeout; storing it goes on in the background", "event", "result_pending", "key", o.key, "id", id, "fence", a.Fence, "err", err)
	default:
		log(err)
	}
	return errors.Join(ErrNotRecorded, fmt.Errorf("%w: %w", ErrStoreUnavailable, err))
}

// settle gives up a's claim once fn returned without a result to store:
// taken back when a was released (Attempt.Release: it did nothing),
// released otherwise. until is when a's lease ends by its own clock.
func (g *Guard) settle(ctx context.Context, a *Attempt, until time.Time) {
	if a.released.Load() {
		g.takeBack(ctx, a.ID, a.owner, until)
		return
	}
	g.release(ctx, a.ID, a.owner, until)
}

// release gives up a claim so that the next attempt runs again. A release
// the store does not answer in time goes on in the background until until;
// failures are logged: the claim then lasts until its lease expires.
func (g *Guard) release(ctx context.Context, id, owner string, until time.Time) {
	g.giveUp(ctx, id, until, "release", func(ctx context.Context) error { return g.store.Release(ctx, id, owner) })
}

// takeBack undoes a claim whose attempt never acted: its answer never
// came, its lease could not be confirmed, or the attempt was released
// (Attempt.Release). With a store that can (idemstore.Unclaimer) the next
// attempt gets the fence this one had, and a copy of the claim still on its
// way to the store is refused; with another store it is a release. It goes
// on in the background until the store answers, or until.
func (g *Guard) takeBack(ctx context.Context, id, owner string, until time.Time) {
	lease := g.lease
	uc, ok := g.store.(idemstore.Unclaimer)
	if !ok {
		g.release(ctx, id, owner, until)
		return
	}
	g.giveUp(ctx, id, until, "take_back", func(ctx context.Context) error { return uc.Unclaim(ctx, id, owner, lease) })
}

// giveUp runs f, a release or a take-back named what, within the write
// timeout, then in the background; it logs what does not succeed.
func (g *Guard) giveUp(ctx context.Context, id string, until time.Time, what string, f func(context.Context) error) {
	logFailed := func(err error) {
		if err != nil && !errors.Is(err, ErrLeaseLost) {
			g.log.WarnContext(ctx, "idem: "+what+" failed; the key stays claimed until its lease expires", "event", what+"_failed", "id", id, "err", err)
		}
	}
	err := g.storeWrite(ctx, g.write, until, f, logFailed)
	if !errors.As(err, new(*pendingError)) {
		logFailed(err)
	}
}
