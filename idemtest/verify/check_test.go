package verify

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

const ms = time.Millisecond

// call is a finished call for a planted history.
func call(key string, start, end time.Duration, kind Kind, result string) Call {
	return Call{Key: key, Request: "r", Start: start, End: end, Kind: kind, Result: result}
}

// ran marks c as a call whose function ran at fence.
func ran(c Call, fence int64) Call {
	c.Ran, c.Fence = true, fence
	return c
}

// clean returns a history with no violation: one key run once and
// replayed, one key taken over at fence 2 whose stale holder was fenced off,
// a key refused while in progress, and a probe.
func clean() *History {
	h := NewHistory()
	h.AddCall(ran(call("a", 0, 10*ms, KindOK, "a1"), 1))                 // #0
	h.AddCall(call("a", 5*ms, 15*ms, KindOK, "a1"))                      // #1 waited, replayed
	h.AddCall(call("a", 20*ms, 21*ms, KindOK, "a1"))                     // #2 replay
	h.AddCall(ran(call("b", 0, 50*ms, KindNotRecordedLeaseLost, ""), 1)) // #3 stale holder
	h.AddCall(ran(call("b", 30*ms, 40*ms, KindOK, "b2"), 2))             // #4 taker
	h.AddCall(call("b", 60*ms, 61*ms, KindOK, "b2"))                     // #5 replay
	h.AddCall(call("c", 1*ms, 2*ms, KindUnavailable, ""))                // #6 fail closed, fn not run
	h.AddCall(call("c", 3*ms, 4*ms, KindInProgress, ""))                 // #7
	h.AddCall(Call{Key: "c", Start: 90 * ms, End: 91 * ms, Kind: KindOK, Result: "c1", Probe: true, Ran: true, Fence: 1})
	h.AddEffect(Effect{Key: "a", Fence: 1, Value: "a1", Call: 0, Accepted: true})
	h.AddEffect(Effect{Key: "b", Fence: 2, Value: "b2", Call: 4, Accepted: true})
	h.AddEffect(Effect{Key: "b", Fence: 1, Value: "b1", Call: 3, Accepted: false}) // fenced off
	h.AddEffect(Effect{Key: "c", Fence: 1, Value: "c1", Call: 8, Accepted: true})
	return h
}

func TestCheckCleanHistory(t *testing.T) {
	r := Check(clean())
	require.True(t, r.OK(), "%v", r.Violations)
	require.Equal(t, 9, r.Operations)
	require.Equal(t, 1, r.Fenced)
	require.Equal(t, 1, r.Probes)
	require.Equal(t, 1, r.Errors[KindUnavailable])
	require.Empty(t, r.Violations)
}

// planted are histories with one violation each, planted in clean().
var planted = []struct {
	name  string
	plant func(h *History)
	count func(r *Report) int
	inv   string
	key   string
	calls []int
}{
	{
		name: "duplicate effect",
		plant: func(h *History) {
			h.AddCall(ran(call("d", 100*ms, 110*ms, KindOK, "d1"), 1)) // #9
			h.AddCall(ran(call("d", 105*ms, 130*ms, KindOK, "d1"), 1)) // #10: concurrent, the claim was lost
			h.AddEffect(Effect{Key: "d", Fence: 1, Value: "d1", Call: 9, Accepted: true})
			h.AddEffect(Effect{Key: "d", Fence: 1, Value: "d1", Call: 10, Accepted: true})
		},
		count: func(r *Report) int { return r.Duplicates },
		inv:   I1, key: "d", calls: []int{9, 10},
	},
	{
		name: "duplicate effect from a killed process",
		plant: func(h *History) {
			h.AddCall(ran(call("g", 100*ms, 110*ms, KindOK, "g1"), 1))                             // #9
			h.AddCall(Call{Key: "g", Request: "r", Start: 105 * ms, End: -1, Ran: true, Fence: 1}) // #10: killed after its effect
			h.AddEffect(Effect{Key: "g", Fence: 1, Value: "g1", Call: 9, Accepted: true})
			h.AddEffect(Effect{Key: "g", Fence: 1, Value: "g10", Call: 10, Accepted: true})
		},
		count: func(r *Report) int { return r.Duplicates },
		inv:   I1, key: "g", calls: []int{9, 10},
	},
	{
		name: "lost result, rerun by a killed process",
		plant: func(h *History) {
			h.AddCall(Call{Key: "a", Request: "r", Start: 30 * ms, End: -1, Ran: true, Fence: 2}) // #9: ran after #0 handed a1, then killed
		},
		count: func(r *Report) int { return r.Lost },
		inv:   I3, key: "a", calls: []int{0, 9},
	},
	{
		name: "lost acknowledged result",
		plant: func(h *History) {
			h.AddCall(ran(call("a", 30*ms, 35*ms, KindNotRecorded, ""), 2)) // #9: ran again after #0 handed a1
		},
		count: func(r *Report) int { return r.Lost },
		inv:   I3, key: "a", calls: []int{0, 9},
	},
	{
		name: "divergent replay",
		plant: func(h *History) {
			h.AddCall(call("b", 70*ms, 71*ms, KindOK, "b-other")) // #9
		},
		count: func(r *Report) int { return r.Divergent },
		inv:   I2, key: "b", calls: []int{4, 9},
	},
	{
		name: "fail-closed error after fn ran",
		plant: func(h *History) {
			h.AddCall(ran(call("e", 100*ms, 110*ms, KindUnavailable, ""), 1)) // #9
		},
		count: func(r *Report) int { return r.FailClosed },
		inv:   I2, key: "e", calls: []int{9},
	},
	{
		name: "key stuck after the faults healed",
		plant: func(h *History) {
			h.AddCall(Call{Key: "f", Start: 100 * ms, End: 200 * ms, Kind: KindInProgress, Probe: true}) // #9
		},
		count: func(r *Report) int { return r.Stuck },
		inv:   I4, key: "f", calls: []int{9},
	},
}

func TestCheckPlantedViolations(t *testing.T) {
	for _, tt := range planted {
		t.Run(tt.name, func(t *testing.T) {
			h := clean()
			tt.plant(h)
			r := Check(h)
			require.False(t, r.OK())
			require.Equal(t, 1, tt.count(r))
			require.Equal(t, 1, r.Total(), "%v", r.Violations)
			require.Len(t, r.Violations, 1)
			v := r.Violations[0]
			require.Equal(t, tt.inv, v.Invariant)
			require.Equal(t, tt.key, v.Key)
			var ids []int
			for _, c := range v.Calls {
				ids = append(ids, c.ID)
			}
			require.Equal(t, tt.calls, ids)
			require.Contains(t, v.String(), fmt.Sprintf("key %q", tt.key))
			require.Contains(t, v.String(), "no fault active")
		})
	}
}

// TestCheckNamesFaultAndLimit: a violation names the faults active while
// its calls ran, and the documented limit among them.
func TestCheckNamesFaultAndLimit(t *testing.T) {
	h := clean()
	h.AddFault(Fault{Name: "proxy delay 50ms", Start: 0, End: 5 * ms})                         // over, before
	h.AddFault(Fault{Name: "evicting server", Limit: LimitEviction, Start: 105 * ms, End: -1}) // still active
	h.AddCall(ran(call("d", 100*ms, 110*ms, KindOK, "d1"), 1))
	h.AddCall(ran(call("d", 120*ms, 130*ms, KindOK, "d2"), 1))
	h.AddEffect(Effect{Key: "d", Fence: 1, Value: "d1", Call: 9, Accepted: true})
	h.AddEffect(Effect{Key: "d", Fence: 1, Value: "d2", Call: 10, Accepted: true})
	r := Check(h)
	require.Equal(t, 1, r.Duplicates)
	require.Equal(t, 1, r.Lost)
	require.Equal(t, 1, r.Divergent)
	require.Equal(t, 3, r.FromLimits)
	for _, v := range r.Violations {
		require.Equal(t, []string{"evicting server"}, v.Faults)
		require.Equal(t, LimitEviction, v.Limit)
		require.True(t, strings.Contains(v.String(), "documented limit of idem: eviction"), v.String())
	}
}

// TestCheckRecorder: calls recorded through Begin, Ran and End, effects
// through a Sink that fences off a stale attempt.
func TestCheckRecorder(t *testing.T) {
	h := NewHistory()
	s := NewSink(h)
	stale := h.Begin("k", "r", false)
	stale.Ran(1)
	taker := h.Begin("k", "r", false)
	taker.Ran(2)
	_, found := s.Lookup("k", 2)
	require.False(t, found)
	require.True(t, s.Apply(taker, "k", 2, "v2"))
	taker.End("v2", nil)
	require.False(t, s.Apply(stale, "k", 1, "v1"), "a fence below the highest seen is refused")
	stale.End("v1", errors.Join(idem.ErrNotRecorded, idem.ErrLeaseLost))
	v, found := s.Lookup("k", 2)
	require.True(t, found)
	require.Equal(t, "v2", v)
	replay := h.Begin("k", "r", false)
	replay.End("v2", nil)
	perm := h.Begin("p", "r", false)
	perm.End("", idem.Permanent(errors.New("declined")))
	end := h.StartFault("pause", "")
	end()
	end()

	r := Check(h)
	require.True(t, r.OK(), "%v", r.Violations)
	require.Equal(t, 4, r.Operations)
	require.Equal(t, 1, r.Fenced)
	require.Equal(t, 1, r.Errors[KindNotRecordedLeaseLost])
	require.Equal(t, 1, r.Errors[KindPermanent])
	calls, effects := h.Len()
	require.Equal(t, 4, calls)
	require.Equal(t, 2, effects)
}

// TestCheckUnfinished: a call whose process was killed has no end; it
// hands nothing out, is counted apart from the errors, and is no violation
// by itself.
func TestCheckUnfinished(t *testing.T) {
	h := clean()
	killed := h.Begin("u", "r", false)
	killed.Ran(1)
	h.Begin("u", "r", false) // killed before its function ran
	r := Check(h)
	require.True(t, r.OK(), "%v", r.Violations)
	require.Equal(t, 2, r.Unfinished)
	require.Zero(t, r.Errors[""])
}

func TestClassify(t *testing.T) {
	tests := []struct {
		err  error
		want Kind
	}{
		{nil, KindOK},
		{errors.Join(idem.ErrNotRecorded, idem.ErrStoreUnavailable), KindNotRecorded},
		{errors.Join(idem.ErrNotRecorded, idem.ErrLeaseLost), KindNotRecordedLeaseLost},
		{&idem.InProgressError{RetryAfter: time.Second}, KindInProgress},
		{idem.ErrMismatch, KindMismatch},
		{idem.ErrInvalidKey, KindInvalidKey},
		{fmt.Errorf("x: %w", idem.ErrStoreUnavailable), KindUnavailable},
		{idem.ErrLeaseLost, KindLeaseLost},
		{idem.Permanent(errors.New("no")), KindPermanent},
		{errors.New("fn failed"), KindFailed},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, Classify(tt.err), "%v", tt.err)
	}
	require.True(t, KindMismatch.FailClosed())
	require.False(t, KindNotRecorded.FailClosed())
}

// TestCheckLinear: a history of 200k calls is checked in one pass.
func TestCheckLinear(t *testing.T) {
	h := NewHistory()
	for i := range 100_000 {
		k := fmt.Sprint("k", i%5000)
		h.AddCall(call(k, time.Duration(i), time.Duration(i+1), KindOK, k))
		h.AddCall(call(k, time.Duration(i), time.Duration(i+2), KindInProgress, ""))
	}
	r := Check(h)
	require.True(t, r.OK())
	require.Equal(t, 200_000, r.Operations)
}
