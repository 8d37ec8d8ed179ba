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
		if err == nil || classify(err) == callAnswered || !time.Now().Before(until) {
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
