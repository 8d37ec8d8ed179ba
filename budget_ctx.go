package idem

import (
	"context"
	"sync"
	"time"
)

// The context of a store call under the store budget. context.WithTimeout
// costs a store call four or five allocations (the context, its timer, the
// timer's function, the cancel function, the Done channel, which go-redis
// always asks for). A caller's context that is never cancelled (Do or Once
// called with context.Background(), a completion detached from its caller)
// needs none of that: the call's deadline is enough, and calls whose
// deadlines fall within one short slice of time can share one Done channel,
// closed by one timer when the slice ends.

// withBudget returns ctx with a deadline d away, and the function that
// releases it, as context.WithTimeout does. When ctx can never be cancelled
// and has no deadline, the deadline is rounded up to the end of a slice of
// time at most a 64th of d long (10ms at most), and the context shares
// its Done channel with the calls whose deadlines end in that slice; on
// context.Background() the context itself is shared, and costs nothing.
// Its cancel function then does nothing: the context ends at its deadline,
// which is all a store call needs of it.
func withBudget(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if ctx.Done() != nil || d <= 0 {
		return context.WithTimeout(ctx, d)
	}
	if _, ok := ctx.Deadline(); ok {
		return context.WithTimeout(ctx, d)
	}
	s := budgetSlice(d)
	if ctx == context.Background() {
		return &s.bg, noCancel
	}
	return &budgetCtx{Context: ctx, s: s}, noCancel
}

// noCancel is the cancel function of a budgetCtx.
func noCancel() {}

// budgetCtx is a context that ends at the end of its slice.
type budgetCtx struct {
	context.Context // the caller's: never done, no deadline; its values
	s               *deadlineSlice
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
