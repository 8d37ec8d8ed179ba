package idem

import (
	"context"
	"errors"
	"time"
)

// holdLease keeps the lease on id while the function runs. The returned
// context is cancelled with cause ErrLeaseLost when the lease is found taken,
// or when it could not be renewed before it would have expired: the holder
// measures the lease locally from the moment the claim (or the last
// successful renewal) was sent, less a margin of a tenth for clock drift.
// stop ends the heartbeat and returns once its goroutine has exited.
func (g *Guard) holdLease(ctx context.Context, id, owner string, claimed time.Time) (hctx context.Context, stop func()) {
	hctx, cancel := context.WithCancelCause(ctx)
	quit := make(chan struct{})
	done := make(chan struct{})
	margin := g.lease / 10
	go func() {
		defer close(done)
		valid := claimed.Add(g.lease - margin)
		next := claimed.Add(g.lease / 3)
		t := time.NewTimer(time.Until(next))
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-hctx.Done():
				return
			case <-t.C:
			}
			now := time.Now()
			if !now.Before(valid) {
				g.log.WarnContext(ctx, "idem: lease could not be renewed in time", "id", id)
				cancel(ErrLeaseLost)
				return
			}
			rctx, rcancel := context.WithDeadline(context.WithoutCancel(ctx), valid)
			err := g.store.Heartbeat(rctx, id, owner, g.lease)
			rcancel()
			switch {
			case err == nil:
				valid = now.Add(g.lease - margin)
				next = now.Add(g.lease / 3)
			case errors.Is(err, ErrLeaseLost):
				g.log.WarnContext(ctx, "idem: lease lost to another attempt", "id", id)
				cancel(ErrLeaseLost)
				return
			default:
				// Try again soon, but wake up in time to give up at valid.
				g.log.WarnContext(ctx, "idem: heartbeat failed", "id", id, "err", err)
				next = time.Now().Add(g.lease / 10)
			}
			if valid.Before(next) {
				next = valid
			}
			t.Reset(time.Until(next))
		}
	}()
	return hctx, func() {
		close(quit)
		<-done
		cancel(nil)
	}
}
