package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// leaseTerms are the terms of a claim's lease: its length, the moment it
// must not outlive (ContextWithLeaseEnd; zero: none), and when the claim
// was sent.
type leaseTerms struct {
	lease time.Duration
	end   time.Time
	sent  time.Time
}

// leaseFor returns the lease a claim under ctx takes, and the end it must
// not outlive (ContextWithLeaseEnd), zero when there is none.
func (g *Guard) leaseFor(ctx context.Context) (time.Duration, time.Time) {
	end, ok := leaseEndFrom(ctx)
	if !ok {
		return g.lease, time.Time{}
	}
	return min(max(time.Until(end), minLease), g.lease), end
}

// renewal returns the lease a renewal sent at sent asks for: the lease,
// cut to the terms' end; false when the end has passed and the lease is
// not renewed any more.
func (lt leaseTerms) renewal(sent time.Time) (time.Duration, bool) {
	if lt.end.IsZero() {
		return lt.lease, true
	}
	if !sent.Before(lt.end) {
		return 0, false
	}
	return min(max(lt.end.Sub(sent), minLease), lt.lease), true
}

// holdLease keeps the lease on id while the function runs, renewing it every
// lease/3, with h, which stop ends. The returned context is cancelled with
// cause ErrLeaseLost when a renewal finds the lease taken, or when the lease
// could not be renewed before it would have expired: the holder measures
// the lease locally from the moment the claim (or the last successful
// renewal) was sent, less a margin of a tenth. That deadline holds even
// while a renewal hangs on an unresponsive server. Each renewal waits at
// most the store timeout; one that fails is tried again a tenth of the
// lease later. Under ContextWithLeaseEnd, no renewal extends the lease
// past the end.
func (g *Guard) holdLease(ctx context.Context, h *leaseHold, id, owner string, lt leaseTerms) (hctx context.Context) {
	*h = leaseHold{g: g, ctx: ctx, id: id, owner: owner, terms: lt, valid: leaseEnd(lt.sent, lt.lease), quit: make(chan struct{})}
	hctx, h.cancel = context.WithCancelCause(ctx)
	// Most functions finish within lease/3: the heartbeat goroutine starts
	// only when the first renewal is due, so they pay for one timer.
	h.running.Add(1)
	h.first = time.AfterFunc(time.Until(lt.sent.Add(lt.lease/3)), h.run)
	return hctx
}

// leaseHold is a lease held while fn runs; see holdLease.
type leaseHold struct {
	g         *Guard
	ctx       context.Context
	cancel    context.CancelCauseFunc
	id, owner string
	terms     leaseTerms
	// valid is the moment until which the lease is the holder's, by its
	// own clock; the heartbeat moves it, and it is read after stop.
	valid   time.Time
	first   *time.Timer // starts the heartbeat
	quit    chan struct{}
	running sync.WaitGroup // the heartbeat, until it returns
}

func (h *leaseHold) run() {
	defer h.running.Done()
	h.heartbeat()
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
func (h *leaseHold) heartbeat() {
	g, ctx, lt := h.g, h.ctx, h.terms
	expire := time.NewTimer(time.Until(h.valid))
	beat := time.NewTimer(0)
	defer expire.Stop()
	defer beat.Stop()
	var (
		inflight chan error // set while a renewal runs
		sent     time.Time
		lease    time.Duration
	)
	defer func() {
		if inflight != nil {
			<-inflight
		}
	}()
	for {
		select {
		case <-h.quit:
			return
		// Not hctx.Done(): when the caller's context ends, fn is told, but
		// the lease is held for as long as fn still runs.
		case <-expire.C:
			g.log.WarnContext(ctx, "idem: lease could not be renewed in time", "event", "lease_renewal_late", "id", h.id)
			h.cancel(ErrLeaseLost)
			return
		case <-beat.C:
			sent = time.Now()
			var ok bool
			if lease, ok = lt.renewal(sent); !ok {
				continue // past the end: the lease runs out, and expire fires
			}
			inflight = make(chan error, 1)
			go func(ch chan<- error, sent, deadline time.Time, lease time.Duration) {
				rctx, rcancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
				defer rcancel()
				err := g.store.Heartbeat(rctx, h.id, h.owner, lease)
				if err != nil && rctx.Err() != nil {
					err = fmt.Errorf("%w: %w", errWriteTimeout, err)
				}
				g.health.report(false, sent, endOf(context.Background(), err), err, g.budget)
				ch <- err
			}(inflight, sent, minTime(h.valid, sent.Add(g.budget)), lease)
		case err := <-inflight:
			inflight = nil
			switch {
			case !time.Now().Before(h.valid):
				// The reply came after the lease it was to extend had
				// run out here: another attempt may have taken over.
				g.log.WarnContext(ctx, "idem: lease could not be renewed in time", "event", "lease_renewal_late", "id", h.id)
				h.cancel(ErrLeaseLost)
				return
			case err == nil:
				h.valid = leaseEnd(sent, lease)
				expire.Reset(time.Until(h.valid))
				beat.Reset(time.Until(sent.Add(lt.lease / 3)))
			case errors.Is(err, ErrLeaseLost):
				g.log.WarnContext(ctx, "idem: lease lost to another attempt", "event", "lease_lost", "id", h.id)
				h.cancel(ErrLeaseLost)
				return
			default:
				g.log.WarnContext(ctx, "idem: heartbeat failed", "event", "heartbeat_failed", "id", h.id, "err", err)
				beat.Reset(lt.lease / 10)
			}
		}
	}
}

// minTime returns the earlier of a and b.
func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// leaseEnd returns the moment until which a lease taken or renewed by a
// command sent at sent is the holder's, by the holder's own clock: Redis
// starts the lease when the command arrives, never before it was sent, and a
// tenth of the lease is kept as a margin against clock drift.
func leaseEnd(sent time.Time, lease time.Duration) time.Time { return sent.Add(lease - lease/10) }

// confirmLease decides whether fn may start on a claim with the terms lt,
// and returns the terms fn starts with. A claim that answered within
// lease/3 is confirmed as it is. A later one (a slow server, or a claim
// re-sent after a lost reply) is renewed first, so that fn starts with
// most of a lease; a claim or renewal whose reply came after the end of the
// lease it set is lost, whatever it says, since another attempt may hold
// the key by then. For a lost or unrenewable claim it returns an error
// wrapping ErrStoreUnavailable (and ErrLeaseLost when the reply came too
// late): fn must not run, and the caller takes the claim back (the next
// attempt gets the same fence).
func (g *Guard) confirmLease(ctx context.Context, id, owner string, lt leaseTerms) (leaseTerms, error) {
	late := time.Since(lt.sent)
	if late <= lt.lease/3 {
		return lt, nil
	}
	if lease, ok := lt.renewal(time.Now()); ok && time.Now().Before(leaseEnd(lt.sent, lt.lease)) {
		sent, err := g.renew(ctx, id, owner, lease)
		switch {
		case err == nil && time.Now().Before(leaseEnd(sent, lease)):
			lt.sent, lt.lease = sent, lease
			return lt, nil
		case err == nil || errors.Is(err, errRenewTimeout):
			err = ErrLeaseLost
		}
		return lt, fmt.Errorf("%w: the claim answered after %v and its lease could not be renewed in time: %w",
			ErrStoreUnavailable, late.Round(time.Millisecond), err)
	}
	return lt, fmt.Errorf("%w: the claim answered after %v, past the end of its %v lease: %w",
		ErrStoreUnavailable, late.Round(time.Millisecond), lt.lease, ErrLeaseLost)
}

// errRenewTimeout reports a renewal that did not answer before the end of
// the lease it would set, or within the store timeout.
var errRenewTimeout = errors.New("idem: the renewal did not answer in time")

// renew renews a lease for another lease and returns the time the renewal
// was sent. It waits for the reply no longer than the store timeout, nor
// than the lease the renewal sets would last, also when the Redis client
// ignores context deadlines.
func (g *Guard) renew(ctx context.Context, id, owner string, lease time.Duration) (time.Time, error) {
	sent := time.Now()
	// Cancelled on return, not when the answer is in: a context ended by
	// its answer must not pass for one that reached its deadline first.
	rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), minTime(leaseEnd(sent, lease), sent.Add(g.budget)))
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- g.store.Heartbeat(rctx, id, owner, lease) }()
	var err error
	select {
	case err = <-done:
		if err != nil && rctx.Err() != nil {
			err = errRenewTimeout // a client that gave up at the deadline
		}
	case <-rctx.Done():
		err = errRenewTimeout
	}
	end := endOf(context.Background(), err)
	if errors.Is(err, errRenewTimeout) {
		end = callFailed
	}
	g.health.report(false, sent, end, err, g.budget)
	return sent, err
}
