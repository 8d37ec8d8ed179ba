package idem

import (
	"context"
	"sync"
	"time"
)

// Store writes that outlive their request: a completion, a release or the
// take-back of an unanswered claim that did not answer within the store
// timeout goes on in the background, tried again until the store answers
// or the lease it is about would have ended. Drain waits for them.

// backlog counts a Guard's background writes.
type backlog struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; nil while n is 0
}

func (b *backlog) add() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n == 0 {
		b.idle = make(chan struct{})
	}
	b.n++
}

func (b *backlog) done() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n--
	if b.n == 0 {
		close(b.idle)
		b.idle = nil
	}
}

// wait returns a channel closed when no write is left, nil when none is.
func (b *backlog) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.idle
}

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

// storeWrite tries f, a store write about the operation id, within the budget
// d, and returns its error. A write that fail-fast refused or that did not
// answer (fail-fast's callFailed) goes on in the background until the store
// answers or until, and then reports to settled (if not nil); write then
// returns errPending wrapping the first try's error.
func (g *Guard) storeWrite(ctx context.Context, d time.Duration, until time.Time, f func(context.Context) error, settled func(error)) error {
	err := g.tryWrite(ctx, d, f)
	if err == nil || classify(err) == callAnswered {
		return err
	}
	g.pending.add()
	go g.retryWrite(context.WithoutCancel(ctx), until, f, settled)
	return &pendingError{first: err}
}

// tryWrite runs f once, detached from ctx's cancellation, if fail-fast lets
// it go out, waiting at most d.
func (g *Guard) tryWrite(ctx context.Context, d time.Duration, f func(context.Context) error) error {
	probe, err := g.health.admit()
	if err != nil {
		return err
	}
	sent := time.Now()
	_, err = within(ctx, g, d, true, func(ctx context.Context) (struct{}, error) { return struct{}{}, f(ctx) })
	g.health.report(probe, sent, endOf(context.Background(), err), err, g.budget)
	return err
}

// retryWrite tries f again until the store answers or until passes.
func (g *Guard) retryWrite(ctx context.Context, until time.Time, f func(context.Context) error, settled func(error)) {
	defer g.pending.done()
	delay := retryFirst
	t := time.NewTimer(delay)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-g.health.answered(): // nil, and never ready, unless failing
		}
		err := g.tryWrite(ctx, g.budget, f)
		if err == nil || classify(err) == callAnswered || !time.Now().Before(until) {
			if settled != nil {
				settled(err)
			}
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
