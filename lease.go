package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// holdLease keeps the lease on id while the function runs, renewing it every
// lease/3, with h, which stop ends. The returned context is cancelled with
// cause ErrLeaseLost when a renewal finds the lease taken, or when the lease
// could not be renewed before it would have expired: the holder measures
// the lease locally from the moment the claim (or the last successful
// renewal) was sent, less a margin of a tenth. That deadline holds even
// while a renewal hangs on an unresponsive server.
func (g *Guard) holdLease(ctx context.Context, h *leaseHold, id, owner string, claimed time.Time) (hctx context.Context) {
	*h = leaseHold{g: g, ctx: ctx, id: id, owner: owner, claimed: claimed, quit: make(chan struct{})}
	hctx, h.cancel = context.WithCancelCause(ctx)
	// Most functions finish within lease/3: the heartbeat goroutine starts
	// only when the first renewal is due, so they pay for one timer.
	h.running.Add(1)
	h.first = time.AfterFunc(time.Until(claimed.Add(g.lease/3)), h.run)
	return hctx
}

// leaseHold is a lease held while fn runs; see holdLease.
type leaseHold struct {
	g         *Guard
	ctx       context.Context
	cancel    context.CancelCauseFunc
	id, owner string
	claimed   time.Time
	first     *time.Timer // starts the heartbeat
	quit      chan struct{}
	running   sync.WaitGroup // the heartbeat, until it returns
}

func (h *leaseHold) run() {
	defer h.running.Done()
	h.g.heartbeat(h.ctx, h.cancel, h.quit, h.id, h.owner, h.claimed)
}

// stop ends the heartbeat and returns once no renewal is in flight.
func (h *leaseHold) stop() {
	if h.first.Stop() {
		h.running.Done() // the heartbeat never started
	} else {
		close(h.quit)
		h.running.Wait()
	}
	h.cancel(nil)
}

// heartbeat renews the lease now and every lease/3 after, until quit is
// closed or the lease is lost; see holdLease.
func (g *Guard) heartbeat(ctx context.Context, cancel context.CancelCauseFunc, quit <-chan struct{}, id, owner string, claimed time.Time) {
	valid := g.leaseEnd(claimed)
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
			g.log.WarnContext(ctx, "idem: lease could not be renewed in time", "event", "lease_renewal_late", "id", id)
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
			case !time.Now().Before(valid):
				// The reply came after the lease it was to extend had
				// run out here: another attempt may have taken over.
				g.log.WarnContext(ctx, "idem: lease could not be renewed in time", "event", "lease_renewal_late", "id", id)
				cancel(ErrLeaseLost)
				return
			case err == nil:
				valid = g.leaseEnd(sent)
				expire.Reset(time.Until(valid))
				beat.Reset(time.Until(sent.Add(g.lease / 3)))
			case errors.Is(err, ErrLeaseLost):
				g.log.WarnContext(ctx, "idem: lease lost to another attempt", "event", "lease_lost", "id", id)
				cancel(ErrLeaseLost)
				return
			default:
				g.log.WarnContext(ctx, "idem: heartbeat failed", "event", "heartbeat_failed", "id", id, "err", err)
				beat.Reset(g.lease / 10)
			}
		}
	}
}

// leaseEnd returns the moment until which a lease taken or renewed by a
// command sent at sent is the holder's, by the holder's own clock: Redis
// starts the lease when the command arrives, never before it was sent, and a
// tenth of the lease is kept as a margin against clock drift.
func (g *Guard) leaseEnd(sent time.Time) time.Time { return sent.Add(g.lease - g.lease/10) }

// confirmLease decides whether fn may start on a claim sent at claimed, and
// returns the moment its lease is measured from. A claim that answered
// within lease/3 is confirmed as it is. A later one (a slow server, or a
// claim re-sent after a lost reply) is renewed first, so that fn starts
// with most of a lease; a claim or renewal whose reply came after the end
// of the lease it set is lost, whatever it says, since another attempt may
// hold the key by then. A lost or unrenewable claim is released and fn does
// not run: the error wraps ErrStoreUnavailable (and ErrLeaseLost when the
// reply came too late).
func (g *Guard) confirmLease(ctx context.Context, id, owner string, claimed time.Time) (time.Time, error) {
	late := time.Since(claimed)
	if late <= g.lease/3 {
		return claimed, nil
	}
	if time.Now().Before(g.leaseEnd(claimed)) {
		sent, err := g.renew(ctx, id, owner)
		switch {
		case err == nil && time.Now().Before(g.leaseEnd(sent)):
			return sent, nil
		case err == nil || errors.Is(err, errRenewTimeout):
			err = ErrLeaseLost
		}
		g.release(ctx, id, owner)
		return time.Time{}, fmt.Errorf("%w: the claim answered after %v and its lease could not be renewed in time: %w",
			ErrStoreUnavailable, late.Round(time.Millisecond), err)
	}
	g.release(ctx, id, owner)
	return time.Time{}, fmt.Errorf("%w: the claim answered after %v, past the end of its %v lease: %w",
		ErrStoreUnavailable, late.Round(time.Millisecond), g.lease, ErrLeaseLost)
}

// errRenewTimeout reports a renewal that did not answer before the end of
// the lease it would set.
var errRenewTimeout = errors.New("idem: the renewal did not answer before the end of its lease")

// renew renews a lease and returns the time the renewal was sent. It waits
// for the reply no longer than the lease the renewal sets would last, also
// when the Redis client ignores context deadlines.
func (g *Guard) renew(ctx context.Context, id, owner string) (time.Time, error) {
	sent := time.Now()
	// Cancelled on return, not when the answer is in: a context ended by
	// its answer must not pass for one that reached its deadline first.
	rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), g.leaseEnd(sent))
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- g.store.Heartbeat(rctx, id, owner, g.lease) }()
	select {
	case err := <-done:
		if err != nil && rctx.Err() != nil {
			err = errRenewTimeout // a client that gave up at the deadline
		}
		return sent, err
	case <-rctx.Done():
		return sent, errRenewTimeout
	}
}
