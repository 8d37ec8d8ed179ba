package idem

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
)

// The store writes made after fn returned, completion and release, run
// detached from the caller's context and bounded by the write timeout, so
// that a caller giving up cannot void a result.

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
