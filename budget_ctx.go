package idem

import (
	"context"
	"sync"
	"time"
)

// The context of a store call under the store budget. context.WithTimeout
// costs a store call four or five allocations (the context, its timer, the
// timer's function, the cancel function, the Done channel, which go-redis
// always asks for). A store call needs less: its deadline, which bounds it
// on the wire (go-redis sets it on the connection), and a Done channel for
// its waits before the wire (a connection from the pool, a batch's reply).
// Calls whose deadlines fall within one short slice of time share one Done
// channel, closed by one timer when the slice ends, so a call's context
// costs one allocation, and none on context.Background().
//
// The call's context does not end with its caller's: a call that has gone
// out is not abandoned half way (go-redis does not stop reading a reply
// when a context is cancelled, only at its deadline), and what waits on the
// caller as well (the reply of a batch) asks callerOf.

// withBudget returns the context of a store call made for ctx that may take
// d, and the function that releases it, as context.WithTimeout does. Its
// deadline is d away, rounded up to the end of a slice of time at most a
// 64th of d long (10ms at most), and it shares its Done channel with the
// calls whose deadlines end in that slice; it has ctx's values. Its cancel
// function does nothing: the context ends at its deadline. When ctx has a
// deadline sooner than that, the call's context is ctx itself. With detach,
// ctx's deadline and cancellation do not count (a write that its caller
// giving up must not void); otherwise callerOf(call) is ctx.
func withBudget(ctx context.Context, d time.Duration, detach bool) (context.Context, context.CancelFunc) {
	if d <= 0 {
		if detach {
			ctx = context.WithoutCancel(ctx)
		}
		return context.WithTimeout(ctx, d)
	}
	s := budgetSlice(d)
	if detach || ctx.Done() == nil {
		if ctx == context.Background() {
			return &s.bg, noCancel
		}
		return &budgetCtx{Context: ctx, s: s}, noCancel
	}
	if dl, ok := ctx.Deadline(); ok && !dl.After(s.end) {
		return ctx, noCancel
	}
	return &budgetCtx{Context: ctx, s: s, caller: ctx}, noCancel
}

// noCancel is the cancel function of a budgetCtx.
func noCancel() {}

// callerOf returns the context of the caller of a store call whose context
// is ctx: nil when the caller's end does not end the call (a detached call).
func callerOf(ctx context.Context) context.Context {
	if c, ok := ctx.(*budgetCtx); ok {
		return c.caller
	}
	return ctx
}

// budgetCtx is a context that ends at the end of its slice, with the values
// of the context it was made for.
type budgetCtx struct {
	context.Context                 // the caller's: its values only
	s               *deadlineSlice  // when it ends
	caller          context.Context // the caller's, to wait on; nil when detached
}

// Deadline returns the end of the context's slice.
func (c *budgetCtx) Deadline() (time.Time, bool) { return c.s.end, true }

// Done returns the slice's channel, closed when the slice ends.
func (c *budgetCtx) Done() <-chan struct{} { return c.s.ended.Done() }

// Err returns context.DeadlineExceeded once Done is closed, else nil.
func (c *budgetCtx) Err() error {
	if c.s.ended.Err() != nil {
		return context.DeadlineExceeded
	}
	return nil
}

// Value returns the caller's value for key, except the one through which
// context.Cause and the contexts derived from this one would find the
// caller's cancellation, which is not this context's (context.WithoutCancel
// hides it the same way).
func (c *budgetCtx) Value(key any) any {
	if isCancelKey(key) {
		return nil
	}
	return c.Context.Value(key)
}

// cancelKeyProbe answers the context package's own key with itself, which
// is how isCancelKey recognizes that key.
var cancelKeyProbe, _ = context.WithCancel(context.Background())

// isCancelKey reports whether key is the context package's key for a
// context's cancellation (a *int no other package can make).
func isCancelKey(key any) bool {
	if _, ok := key.(*int); !ok {
		return false
	}
	return cancelKeyProbe.Value(key) == any(cancelKeyProbe)
}

// AfterFunc arranges to call f once the context ends, as context.AfterFunc
// does; a context derived from this one (context.WithTimeout in go-redis's
// rarer paths) uses it instead of a goroutine of its own.
func (c *budgetCtx) AfterFunc(f func()) (stop func() bool) { return context.AfterFunc(c.s.ended, f) }

// String names the context, as the standard library's contexts do.
func (c *budgetCtx) String() string { return "idem.budgetCtx" }

// deadlineSlice is a slice of time whose end is the deadline of the store
// calls that share it.
type deadlineSlice struct {
	end   time.Time       // monotonic, from slicesBase
	n     int64           // end, as a count of widths from slicesBase
	w     time.Duration   // width
	ended context.Context // cancelled at end
	bg    budgetCtx       // the slice's context over context.Background()
}

// deadlineSlices are the slices made last, for reuse by the calls that follow;
// a few, for the few durations a Guard uses (the store timeout, the write
// timeout).
var deadlineSlices struct {
	mu   sync.Mutex
	ring [8]*deadlineSlice
	next int
}

// slicesBase is the origin of slice ends: a monotonic reading, so that a
// change of the wall clock moves no deadline.
var slicesBase = time.Now()

// budgetSlice returns the slice whose end is the first at or after d from
// now, making it when it does not exist yet.
func budgetSlice(d time.Duration) *deadlineSlice {
	w := min(d/64, 10*time.Millisecond)
	if w <= 0 {
		w = 1
	}
	t := time.Since(slicesBase) + d
	n := int64((t + w - 1) / w)
	deadlineSlices.mu.Lock()
	defer deadlineSlices.mu.Unlock()
	for _, s := range deadlineSlices.ring {
		if s != nil && s.w == w && s.n == n {
			return s
		}
	}
	s := &deadlineSlice{end: slicesBase.Add(time.Duration(n) * w), n: n, w: w}
	var end context.CancelFunc
	s.ended, end = context.WithCancel(context.Background())
	s.bg = budgetCtx{Context: context.Background(), s: s}
	time.AfterFunc(time.Until(s.end), end)
	deadlineSlices.ring[deadlineSlices.next] = s
	deadlineSlices.next = (deadlineSlices.next + 1) % len(deadlineSlices.ring)
	return s
}
