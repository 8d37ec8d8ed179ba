package idem

import (
	"context"
	"errors"
	"time"
)

// holdLease keeps the lease on id while the function runs, renewing it every
// lease/3. The returned context is cancelled with cause ErrLeaseLost when a
// renewal finds the lease taken, or when the lease could not be renewed
// before it would have expired: the holder measures the lease locally from
// the moment the claim (or the last successful renewal) was sent, less a
// margin of a tenth. That deadline holds even while a renewal hangs on an
// unresponsive server. stop ends the heartbeat and returns once no renewal
// is in flight.
func (g *Guard) holdLease(ctx context.Context, id, owner string, claimed time.Time) (hctx context.Context, stop func()) {
	hctx, cancel := context.WithCancelCause(ctx)
	quit := make(chan struct{})
	done := make(chan struct{})
	// Most functions finish within lease/3: the heartbeat goroutine starts
	// only when the first renewal is due, so they pay for one timer.
	first := time.AfterFunc(time.Until(claimed.Add(g.lease/3)), func() {
		defer close(done)
		g.heartbeat(ctx, cancel, quit, id, owner, claimed)
	})
	return hctx, func() {
		if !first.Stop() {
			close(quit)
			<-done
		}
		cancel(nil)
	}
}

// heartbeat renews the lease now and every lease/3 after, until quit is
// closed or the lease is lost; see holdLease.
func (g *Guard) heartbeat(ctx context.Context, cancel context.CancelCauseFunc, quit <-chan struct{}, id, owner string, claimed time.Time) {
	margin := g.lease / 10
	valid := claimed.Add(g.lease - margin)
	expire := time.NewTimer(time.Until(valid))
	beat := time.NewTimer(0)
	defer expire.Stop()
	defer beat.Stop()
	var (
		inflight chan error // set while a renewal runs
		sent     time.Time
	)
	defer func() {
		if inflight != nil {
			<-inflight
		}
	}()
	for {
		select {
		case <-quit:
			return
		// Not hctx.Done(): when the caller's context ends, fn is told, but
		// the lease is held for as long as fn still runs.
		case <-expire.C:
			g.log.WarnContext(ctx, "idem: lease could not be renewed in time", "id", id)
			cancel(ErrLeaseLost)
			return
		case <-beat.C:
			sent = time.Now()
			inflight = make(chan error, 1)
			go func(ch chan<- error, deadline time.Time) {
				rctx, rcancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
				defer rcancel()
				ch <- g.store.Heartbeat(rctx, id, owner, g.lease)
			}(inflight, valid)
		case err := <-inflight:
			inflight = nil
			switch {
			case err == nil:
				valid = sent.Add(g.lease - margin)
				expire.Reset(time.Until(valid))
				beat.Reset(time.Until(sent.Add(g.lease / 3)))
			case errors.Is(err, ErrLeaseLost):
				g.log.WarnContext(ctx, "idem: lease lost to another attempt", "id", id)
				cancel(ErrLeaseLost)
				return
			default:
				g.log.WarnContext(ctx, "idem: heartbeat failed", "id", id, "err", err)
				beat.Reset(g.lease / 10)
			}
		}
	}
}

// renew renews a lease whose claim took long to answer, so that the holder
// measures its lease from now rather than from the claim. It returns the
// time the renewal was sent.
func (g *Guard) renew(ctx context.Context, id, owner string) (time.Time, error) {
	sent := time.Now()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.lease-g.lease/10)
	defer cancel()
	return sent, g.store.Heartbeat(rctx, id, owner, g.lease)
}
