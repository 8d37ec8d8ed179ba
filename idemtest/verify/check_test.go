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

// TestCheckAttributesCrashWithinReach: a crash of a Redis with AOF
// everysec loses the writes of the seconds before it (Fault.Reach). A key
// handed out within the reach and run again after the crash is a
// violation attributed to that limit, with its duplicate effect and its
// divergent replay; the same loss handed out before the reach, or seen
// only among calls after the restart, or a violation of one call during
// the crash, is a violation outside the documented limits.
func TestCheckAttributesCrashWithinReach(t *testing.T) {
	const reach = time.Second
	crash := Fault{Name: "Redis killed (SIGKILL), AOF everysec", Limit: LimitAOFEverysec, Start: 5000 * ms, End: 5400 * ms, Reach: reach}
	// lost plants, on key k, a result handed out by a call that ran in
	// [start, end], and a run again after the restart that hands out
	// another, its effect accepted again at fence 1: the record was lost.
	lost := func(h *History, k string, start, end time.Duration) {
		first := len(h.calls)
		h.AddCall(ran(call(k, start, end, KindOK, k+"1"), 1))
		h.AddCall(ran(call(k, 5500*ms, 5600*ms, KindOK, k+"2"), 1))
		h.AddEffect(Effect{Key: k, Fence: 1, Value: k + "1", Call: first, Accepted: true})
		h.AddEffect(Effect{Key: k, Fence: 1, Value: k + "2", Call: first + 1, Accepted: true})
	}
	tests := []struct {
		name       string
		plant      func(h *History)
		total      int
		fromLimits int
		after      bool // the calls all came after the crash, which they do not name
	}{
		{
			name:  "handed out just before the crash",
			plant: func(h *History) { lost(h, "x", 4950*ms, 4990*ms) },
			total: 3, fromLimits: 3, // I1, I2 and I3: all the limit's
		},
		{
			name:  "handed out at the edge of the reach",
			plant: func(h *History) { lost(h, "x", 3990*ms, 4000*ms) },
			total: 3, fromLimits: 3,
		},
		{
			name:  "handed out while the crash began",
			plant: func(h *History) { lost(h, "x", 4990*ms, 5010*ms) },
			total: 3, fromLimits: 3,
		},
		{
			name:  "handed out before the reach",
			plant: func(h *History) { lost(h, "x", 3900*ms, 3950*ms) },
			total: 3, fromLimits: 0,
		},
		{
			name: "lost after the restart",
			plant: func(h *History) {
				h.AddCall(ran(call("y", 5410*ms, 5450*ms, KindOK, "y1"), 1))
				h.AddCall(ran(call("y", 5500*ms, 5600*ms, KindOK, "y1"), 2))
			},
			total: 1, fromLimits: 0, after: true,
		},
		{
			name: "fail-closed error during the crash",
			plant: func(h *History) {
				h.AddCall(ran(call("z", 4990*ms, 5100*ms, KindUnavailable, ""), 1))
			},
			total: 1, fromLimits: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := clean()
			h.AddFault(crash)
			tt.plant(h)
			r := Check(h)
			require.Equal(t, tt.total, r.Total(), "%v", r.Violations)
			require.Equal(t, tt.fromLimits, r.FromLimits, "%v", r.Violations)
			for _, v := range r.Violations {
				if !tt.after {
					require.Contains(t, v.Faults, crash.Name, "the crash is named either way: %s", v)
				}
				if tt.fromLimits > 0 {
					require.Equal(t, LimitAOFEverysec, v.Limit)
					require.Contains(t, v.String(), "documented limit of idem: "+LimitAOFEverysec)
				} else {
					require.Empty(t, v.Limit)
				}
			}
		})
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
