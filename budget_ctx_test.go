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
	a, cancelA := withBudget(context.Background(), d)
	b, cancelB := withBudget(context.Background(), d)
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
	ctx, cancel := withBudget(parent, 20*time.Millisecond)
	defer cancel()
	require.IsType(t, &budgetCtx{}, ctx)
	require.Equal(t, "v", ctx.Value(budgetKey{}))
	<-ctx.Done()
	require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)

	// Detached from a cancelled caller: still its values, not its end.
	caller, stop := context.WithCancel(parent)
	stop()
	ctx, cancel = withBudget(context.WithoutCancel(caller), time.Minute)
	defer cancel()
	require.Equal(t, "v", ctx.Value(budgetKey{}))
	require.NoError(t, ctx.Err())
}

// TestWithBudgetCancellable: a parent that can be cancelled, or has a
// deadline, gets context.WithTimeout: its cancellation ends the call's
// context at once, and so does the cancel function.
func TestWithBudgetCancellable(t *testing.T) {
	parent, stop := context.WithCancel(context.Background())
	ctx, cancel := withBudget(parent, time.Minute)
	defer cancel()
	_, shared := ctx.(*budgetCtx)
	require.False(t, shared)
	stop()
	<-ctx.Done()
	require.ErrorIs(t, ctx.Err(), context.Canceled)

	parent, stop = context.WithTimeout(context.Background(), time.Hour)
	defer stop()
	ctx, cancel = withBudget(parent, time.Minute)
	cancel()
	<-ctx.Done()
	require.ErrorIs(t, ctx.Err(), context.Canceled)

	ctx, cancel = withBudget(context.Background(), 0)
	defer cancel()
	<-ctx.Done()
	require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
}

// TestWithBudgetAllocs: on context.Background() a call's context costs no
// allocation (a slice's own, once per millisecond at most, rounds down).
func TestWithBudgetAllocs(t *testing.T) {
	require.Zero(t, testing.AllocsPerRun(100, func() {
		_, cancel := withBudget(context.Background(), time.Second)
		cancel()
	}))
}

// TestWithBudgetDerived: a context derived from a shared one ends with it.
func TestWithBudgetDerived(t *testing.T) {
	ctx, cancel := withBudget(context.Background(), 20*time.Millisecond)
	defer cancel()
	child, stop := context.WithTimeout(ctx, time.Hour)
	defer stop()
	dl, _ := ctx.Deadline()
	cdl, _ := child.Deadline()
	require.Equal(t, dl, cdl, "the earlier deadline")
	<-child.Done()
	require.ErrorIs(t, child.Err(), context.DeadlineExceeded)
}
