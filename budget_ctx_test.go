package idem

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWithBudgetShared: on context.Background() the calls of one slice get
// one context, which ends at its deadline (not before), d away rounded up
// by at most a 64th of d, and then reports DeadlineExceeded.
func TestWithBudgetShared(t *testing.T) {
	const d = 40 * time.Millisecond
	before := time.Now()
	a, cancelA := withBudget(context.Background(), d, false)
	b, cancelB := withBudget(context.Background(), d, false)
	after := time.Now()
	defer cancelA()
	defer cancelB()
	if a != b {
		// The second call fell in the next slice: both are still whole.
		da, _ := a.Deadline()
		db, _ := b.Deadline()
		require.True(t, db.After(da), "slices are made in order")
	}
	dl, ok := a.Deadline()
	require.True(t, ok)
	require.False(t, dl.Before(before.Add(d)), "the deadline is never earlier than asked")
	require.False(t, dl.After(after.Add(d+d/64)), "rounded up by at most a 64th")
	require.NoError(t, a.Err())
	cancelA() // does not end the shared context
	require.NoError(t, b.Err())
	<-a.Done()
	require.False(t, time.Now().Before(dl), "Done closes at the deadline, not before")
	require.ErrorIs(t, a.Err(), context.DeadlineExceeded)
	require.ErrorIs(t, context.Cause(a), context.DeadlineExceeded)
}

type budgetKey struct{}

// TestWithBudgetKeepsValues: a parent that is never cancelled but carries
// values keeps them, and ends with the slice.
func TestWithBudgetKeepsValues(t *testing.T) {
	parent := context.WithValue(context.Background(), budgetKey{}, "v")
	ctx, cancel := withBudget(parent, 20*time.Millisecond, false)
	defer cancel()
	require.IsType(t, &budgetCtx{}, ctx)
	require.Equal(t, "v", ctx.Value(budgetKey{}))
	<-ctx.Done()
	require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)

	// Detached from a cancelled caller: still its values, not its end.
	caller, stop := context.WithCancel(parent)
	stop()
	ctx, cancel = withBudget(context.WithoutCancel(caller), time.Minute, false)
	defer cancel()
	require.Equal(t, "v", ctx.Value(budgetKey{}))
	require.NoError(t, ctx.Err())
}

// TestWithBudgetCancellable: a parent that can be cancelled gets a context
// of its own that ends at the budget, not with the parent (a call that went
// out is not abandoned half way), with callerOf naming the parent for what
// waits on it as well; its Cause is the budget's, not the parent's. A
// parent whose deadline comes before the budget's is the call's context.
func TestWithBudgetCancellable(t *testing.T) {
	parent, stop := context.WithCancel(context.WithValue(context.Background(), budgetKey{}, "v"))
	ctx, cancel := withBudget(parent, 20*time.Millisecond, false)
	defer cancel()
	require.IsType(t, &budgetCtx{}, ctx)
	require.Equal(t, parent, callerOf(ctx))
	require.Equal(t, "v", ctx.Value(budgetKey{}))
	stop()
	require.NoError(t, ctx.Err(), "the parent's end is not the call's")
	child, stopChild := context.WithCancel(ctx)
	defer stopChild()
	<-ctx.Done()
	require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
	require.ErrorIs(t, context.Cause(ctx), context.DeadlineExceeded)
	<-child.Done()
	require.ErrorIs(t, context.Cause(child), context.DeadlineExceeded, "a derived context ends with the budget")

	late, stopLate := context.WithTimeout(context.Background(), time.Hour)
	defer stopLate()
	ctx, cancel = withBudget(late, time.Minute, false)
	defer cancel()
	require.IsType(t, &budgetCtx{}, ctx)
	dl, _ := ctx.Deadline()
	require.WithinDuration(t, time.Now().Add(time.Minute), dl, time.Second)

	soon, stopSoon := context.WithTimeout(context.Background(), time.Second)
	defer stopSoon()
	ctx, cancel = withBudget(soon, time.Minute, false)
	defer cancel()
	require.Equal(t, soon, ctx, "the caller's deadline comes first")
	require.Equal(t, soon, callerOf(ctx))

	ctx, cancel = withBudget(context.Background(), 0, false)
	defer cancel()
	<-ctx.Done()
	require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
}

// TestWithBudgetDetached: detached, a call's context has neither the
// caller's end nor its deadline, and no caller to wait on.
func TestWithBudgetDetached(t *testing.T) {
	caller, stop := context.WithTimeout(context.WithValue(context.Background(), budgetKey{}, "v"), time.Millisecond)
	defer stop()
	<-caller.Done()
	ctx, cancel := withBudget(caller, time.Minute, true)
	defer cancel()
	require.NoError(t, ctx.Err())
	require.Nil(t, callerOf(ctx))
	require.Equal(t, "v", ctx.Value(budgetKey{}))
	dl, _ := ctx.Deadline()
	require.WithinDuration(t, time.Now().Add(time.Minute), dl, time.Second)
	require.NoError(t, context.Cause(ctx))
}

// TestWithBudgetAllocs: on context.Background() a call's context costs no
// allocation (a slice's own, once per millisecond at most, rounds down).
func TestWithBudgetAllocs(t *testing.T) {
	require.Zero(t, testing.AllocsPerRun(100, func() {
		_, cancel := withBudget(context.Background(), time.Second, false)
		cancel()
	}))
}

// TestWithBudgetDerived: a context derived from a shared one ends with it.
func TestWithBudgetDerived(t *testing.T) {
	ctx, cancel := withBudget(context.Background(), 20*time.Millisecond, false)
	defer cancel()
	child, stop := context.WithTimeout(ctx, time.Hour)
	defer stop()
	dl, _ := ctx.Deadline()
	cdl, _ := child.Deadline()
	require.Equal(t, dl, cdl, "the earlier deadline")
	<-child.Done()
	require.ErrorIs(t, child.Err(), context.DeadlineExceeded)
}
