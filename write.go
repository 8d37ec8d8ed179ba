package idem

import (
	"context"
	"fmt"
	"time"
)

// The store budget: every store call on a request's path waits at most the
// Guard's store timeout (WithStoreTimeout), whatever the Redis client's own
// timeouts and retries, and goes through fail-fast first (storeHealth).

// storeCall runs f, one store call on a request's path, if fail-fast lets
// it go out, and waits for it at most the store timeout. It returns when the
// call was sent (the moment its lease is measured from), and a
// *failingError when the call was refused and never sent (a notSentError
// when ctx had already ended). Call sites on the
// hot path use beginCall and endCall instead where the store returns by its
// deadline, so that no closure is made.
func storeCall[T any](ctx context.Context, g *Guard, f func(context.Context) (T, error)) (T, time.Time, error) {
	if ctx.Err() != nil {
		var zero T
		return zero, time.Time{}, notSentError{ctx.Err()}
	}
	probe, err := g.health.admit()
	if err != nil {
		var zero T
		return zero, time.Time{}, err
	}
	sent := time.Now()
	v, err := callWithin(ctx, g, g.budget, false, f)
	g.health.report(probe, sent, endOf(ctx, err), err, g.budget)
	return v, sent, err
}

// inlineCall is a store call made on the caller's goroutine, to a store
// that returns by its context's deadline; see beginCall.
type inlineCall struct {
	caller context.Context // the caller's context
	ctx    context.Context // the call's: the caller's, with the deadline
	cancel context.CancelFunc
	probe  bool
	sent   time.Time
}

// beginCall starts a store call on the caller's goroutine, to be ended by endCall:
// it asks fail-fast (a *failingError when the call is refused) and returns
// the call's context, ctx with a deadline d away (detached from ctx's
// cancellation with detach).
func (g *Guard) beginCall(ctx context.Context, d time.Duration, detach bool) (inlineCall, error) {
	if !detach && ctx.Err() != nil {
		return inlineCall{}, notSentError{ctx.Err()}
	}
	probe, err := g.health.admit()
	if err != nil {
		return inlineCall{}, err
	}
	c := inlineCall{caller: ctx, probe: probe, sent: time.Now()}
	if detach {
		c.caller = context.Background()
	}
	c.ctx, c.cancel = withBudget(ctx, d, detach)
	return c, nil
}

// endCall ends a call started by beginCall that returned err, and returns err,
// wrapping errWriteTimeout when the call's deadline ended it.
func (g *Guard) endCall(c *inlineCall, err error) error {
	if err != nil && c.caller.Err() == nil && c.ctx.Err() != nil {
		err = fmt.Errorf("%w: %w", errWriteTimeout, err)
	}
	c.cancel()
	g.health.report(c.probe, c.sent, endOf(c.caller, err), err, g.budget)
	return err
}

// bounded runs a store write detached from ctx's cancellation and waits for
// it at most the write timeout; see callWithin.
func (g *Guard) bounded(ctx context.Context, f func(ctx context.Context) error) error {
	_, err := callWithin(ctx, g, g.write, true, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, f(ctx)
	})
	return err
}

// callWithin runs f, a store call, and waits for it at most d; f gets a context
// with that deadline. With detach, f runs without ctx's cancellation (a
// write after fn returned, which a caller giving up must not void);
// otherwise the wait also ends when ctx does, with ctx's cause (storeCall,
// its one caller that does not detach, sends nothing once ctx has ended).
//
// A store whose client returns by its context's deadline (a RedisStore on a
// go-redis client with ContextTimeoutEnabled) is called on the caller's
// goroutine. Another may ignore the deadline (go-redis does unless
// ContextTimeoutEnabled is set, and then retries past it): the call then
// runs on a goroutine of its own, which is left to finish within the
// client's own timeouts when the wait ends. A call not answered within d
// returns an error wrapping errWriteTimeout.
func callWithin[T any](ctx context.Context, g *Guard, d time.Duration, detach bool, f func(context.Context) (T, error)) (T, error) {
	if g.inlineWrites {
		wctx, cancel := withBudget(ctx, d, detach)
		defer cancel()
		v, err := f(wctx)
		if err != nil && (detach || ctx.Err() == nil) && wctx.Err() != nil {
			err = fmt.Errorf("%w: %w", errWriteTimeout, err)
		}
		return v, err
	}
	c := &boundedCall[T]{f: f, end: make(chan struct{})}
	c.ctx, c.cancel = withBudget(ctx, d, detach)
	go c.run()
	var gone <-chan struct{} // nil: never
	if !detach {
		gone = ctx.Done()
	}
	select {
	case <-c.end:
		return c.v, c.err
	case <-c.ctx.Done():
	case <-gone:
	}
	var zero T
	if !detach && ctx.Err() != nil {
		return zero, context.Cause(ctx)
	}
	return zero, errWriteTimeout
}

// boundedCall is a store call run by callWithin on a goroutine of its own.
type boundedCall[T any] struct {
	f      func(context.Context) (T, error)
	ctx    context.Context
	cancel context.CancelFunc
	v      T
	err    error
	end    chan struct{} // closed once v and err are set
}

func (c *boundedCall[T]) run() {
	c.v, c.err = c.f(c.ctx)
	c.cancel()
	close(c.end)
}

// saveCheckpoint saves a checkpoint of a within the store timeout, if
// fail-fast lets it go out.
func (g *Guard) saveCheckpoint(ctx context.Context, a *Attempt, name string, value []byte) error {
	if !g.inlineWrites {
		_, _, err := storeCall(ctx, g, func(ctx context.Context) (struct{}, error) {
			return struct{}{}, a.store.Checkpoint(ctx, a.ID, a.owner, name, value)
		})
		return err
	}
	c, err := g.beginCall(ctx, g.budget, false)
	if err != nil {
		return err
	}
	return g.endCall(&c, a.store.Checkpoint(c.ctx, a.ID, a.owner, name, value))
}
