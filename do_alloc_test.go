package idem_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// TestDoAllocs pins the heap allocations of a Do on a store that answers in
// memory (cannedStore), fresh and replayed, with the buffers the library
// pools (the request's JSON encoder) in the figures: one not given back
// shows as an allocation more (Go 1.27 takes one more than Go 1.26 in each:
// the figures are 1.27's). Lower them when they drop, never raise them to
// let a change through. The store timeout's context costs none here (a
// caller's context that is never cancelled shares a deadline: withBudget);
// context.WithTimeout cost four or five per store call.
func TestDoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	s := &cannedStore{}
	g := idem.New(s, quiet)
	ctx := context.Background()
	req := payment{Amount: 1000, Currency: "EUR"}
	do := func() {
		if _, err := idem.Do(ctx, g, "8e03978e-40d5-43e8-bc93-6894a57f9324", req, okFn("pay_9f8e7d6c")); err != nil {
			t.Fatal(err)
		}
	}
	fresh := testing.AllocsPerRun(200, do)
	s.replay = true
	replay := testing.AllocsPerRun(200, do)
	t.Logf("allocations per call: %.0f fresh, %.0f replay", fresh, replay)
	require.LessOrEqual(t, fresh, 15.0, "fresh call")
	require.LessOrEqual(t, replay, 4.0, "replay")
}

// TestDoAllocsCancellable: a caller's context that can be cancelled (a
// request's) costs the store budget one allocation per store call, not the
// four or five of context.WithTimeout; a context with a deadline sooner than
// the budget costs none.
func TestDoAllocsCancellable(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	soon, cancelSoon := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancelSoon()
	a := doAllocs(t, func(s *cannedStore) idemstore.Store { return s }, ctx, soon)
	t.Logf("allocations per call: %.0f fresh, %.0f replay, %.0f replay with a deadline sooner than the budget", a.fresh, a.replay, a.replayOther)
	require.LessOrEqual(t, a.fresh, 15.0+2, "fresh call: one per store call")
	require.LessOrEqual(t, a.replay, 4.0+1, "replay: one for its one store call")
	require.LessOrEqual(t, a.replayOther, 4.0, "replay: the caller's deadline comes first")
}

// lateStore is cannedStore without idemstore.DeadlineAware: a store that
// may answer past its context's deadline (go-redis without
// ContextTimeoutEnabled), which a Guard calls on a goroutine of its own.
type lateStore struct{ *cannedStore }

func (lateStore) ReturnsByDeadline() {} // not DeadlineAware's method: hides cannedStore's

// TestDoAllocsGoroutine: a store call on a goroutine of its own costs the
// goroutine's call, its end's channel and the budget's context (one
// allocation, none on context.Background()), not context.WithTimeout's four
// or five.
func TestDoAllocsGoroutine(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := doAllocs(t, func(s *cannedStore) idemstore.Store { return lateStore{s} }, ctx, context.Background())
	t.Logf("allocations per call: %.0f fresh, %.0f replay, %.0f replay on context.Background()", a.fresh, a.replay, a.replayOther)
	require.LessOrEqual(t, a.fresh, 25.0, "fresh call")
	require.LessOrEqual(t, a.replay, 9.0, "replay")
	require.LessOrEqual(t, a.replayOther, 8.0, "replay, context.Background()")
}

// allocs are the allocations of a fresh Do and of a replay on ctx, and of
// a replay on another context.
type allocs struct{ fresh, replay, replayOther float64 }

// doAllocs measures allocs on a canned store, wrapped by wrap, for the
// Guard; it skips under the race detector.
func doAllocs(t *testing.T, wrap func(*cannedStore) idemstore.Store, ctx, other context.Context) allocs {
	t.Helper()
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	s := &cannedStore{}
	g := idem.New(wrap(s), quiet)
	req := payment{Amount: 1000, Currency: "EUR"}
	do := func(ctx context.Context) {
		if _, err := idem.Do(ctx, g, "8e03978e-40d5-43e8-bc93-6894a57f9324", req, okFn("pay_9f8e7d6c")); err != nil {
			t.Fatal(err)
		}
	}
	var a allocs
	a.fresh = testing.AllocsPerRun(200, func() { do(ctx) })
	s.replay = true
	a.replay = testing.AllocsPerRun(200, func() { do(ctx) })
	a.replayOther = testing.AllocsPerRun(200, func() { do(other) })
	return a
}
