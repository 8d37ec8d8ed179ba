package idem_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
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
	require.LessOrEqual(t, fresh, 16.0, "fresh call")
	require.LessOrEqual(t, replay, 5.0, "replay")
}
