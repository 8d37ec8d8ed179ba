package verify

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// callIDs returns the IDs of a violation's calls.
func callIDs(v Violation) []int {
	var ids []int
	for _, c := range v.Calls {
		ids = append(ids, c.ID)
	}
	return ids
}

// TestViolationString: the one-line description names every call with its
// entry point, interval (or "unfinished"), kind, fence and what it handed
// out, then the faults and the documented limit.
func TestViolationString(t *testing.T) {
	h := clean()
	h.AddCall(Call{Key: "a", Request: "r", Via: "http", Start: 30 * ms, End: -1, Ran: true, Fence: 2}) // #9
	r := Check(h)
	require.Len(t, r.Violations, 1)
	require.Equal(t, `I3 lost result: fn ran again after a result was handed out: key "a": `+
		`call #0 [0s–10ms] ok, fn ran at fence 1, got "a1"; `+
		`call #9 (http) [30ms–] unfinished, fn ran at fence 2; no fault active`, r.Violations[0].String())

	// A call at the History's very start ends at 0: it is finished.
	h = NewHistory()
	h.AddCall(Call{Key: "e", Via: "do", Start: 0, End: 0, Ran: true, Fence: 1, Kind: KindUnavailable})
	h.AddCall(Call{Key: "p", Start: 5 * ms, End: 6 * ms, Kind: KindPermanent, Result: "declined"})
	h.AddFault(Fault{Name: "pause", Start: 0, End: 1 * ms})
	h.AddFault(Fault{Name: "evicting", Limit: LimitEviction, Start: 0, End: -1})
	r = Check(h)
	require.Len(t, r.Violations, 1)
	require.Equal(t, `I2 fail-closed error after fn ran: key "e": call #0 (do) [0s–0s] store_unavailable, fn ran at fence 1; `+
		`during pause, evicting; from a documented limit of idem: eviction (still a violation)`, r.Violations[0].String())
	require.Equal(t, 1, r.Errors[KindPermanent])
	require.Equal(t, 1, r.Errors[KindUnavailable])
}

// TestCheckDuplicateEdges: a duplicate of the very first effect recorded
// is caught, and an effect offered by a call the History does not hold
// (its process recorded nothing else) still counts, naming the calls held.
func TestCheckDuplicateEdges(t *testing.T) {
	h := NewHistory()
	h.AddCall(ran(call("d", 0, 10*ms, KindOK, "d0"), 1)) // #0
	h.AddCall(ran(call("d", 20*ms, 30*ms, KindOK, "d0"), 1))
	h.AddEffect(Effect{Key: "d", Fence: 1, Value: "d0", Call: 0, Accepted: true})
	h.AddEffect(Effect{Key: "d", Fence: 1, Value: "d0", Call: 2, Accepted: true}) // call #2 is not in the History
	h.AddEffect(Effect{Key: "d", Fence: 1, Value: "d0", Call: -1, Accepted: true})
	r := Check(h)
	require.Equal(t, 2, r.Duplicates)
	require.Equal(t, 1, r.Lost, "#1 ran after #0 handed out d0")
	require.Equal(t, 3, r.Total())
	require.Equal(t, I1, r.Violations[0].Invariant)
	require.Equal(t, []int{0}, callIDs(r.Violations[0]), "the call the History does not hold is left out")
	require.Equal(t, []int{0}, callIDs(r.Violations[1]))
}

// TestCheckFirstHandedOut: the first result of a key is the one handed out
// first by end, the earliest recorded on a tie, and a call is lost only
// when it starts after that end: one that starts at that very instant is
// concurrent with it.
func TestCheckFirstHandedOut(t *testing.T) {
	h := NewHistory()
	h.AddCall(ran(call("a", 0, 10*ms, KindOK, "a1"), 1)) // #0
	h.AddCall(call("a", 5*ms, 10*ms, KindOK, "a2"))      // #1: ends with #0, another result
	h.AddCall(ran(call("a", 10*ms, 12*ms, KindNotRecordedLeaseLost, ""), 2))
	r := Check(h)
	require.Equal(t, 1, r.Total(), "%v", r.Violations)
	require.Equal(t, 1, r.Divergent)
	require.Equal(t, []int{0, 1}, callIDs(r.Violations[0]), "the earliest first")

	h.AddCall(ran(call("a", 10*ms+1, 12*ms, KindNotRecordedLeaseLost, ""), 3)) // #3: after the result
	r = Check(h)
	require.Equal(t, 1, r.Lost)
	require.Equal(t, []int{0, 3}, callIDs(r.Violations[1]))
}

// TestCheckFaultIntervals: a fault and a call are intervals with their
// ends included: a fault that ends as the call starts, or starts as it
// ends, was active while it ran, and its documented limit (without a
// Reach) covers a violation of one call as of several.
func TestCheckFaultIntervals(t *testing.T) {
	tests := []struct {
		name        string
		start, end  time.Duration // the call's
		fault       Fault
		named, limt bool
	}{
		{name: "fault ends as the call starts", start: 20 * ms, end: 30 * ms, fault: Fault{Start: 10 * ms, End: 20 * ms}, named: true},
		{name: "fault starts as the call ends", start: 20 * ms, end: 30 * ms, fault: Fault{Start: 30 * ms, End: 40 * ms}, named: true},
		{name: "fault still active", start: 20 * ms, end: 30 * ms, fault: Fault{Start: 25 * ms, End: -1}, named: true},
		{name: "fault after the call", start: 20 * ms, end: 30 * ms, fault: Fault{Start: 31 * ms, End: 40 * ms}},
		{name: "fault before the call", start: 20 * ms, end: 30 * ms, fault: Fault{Start: 0, End: 19 * ms}},
		{name: "fault at 0 before the call", start: 20 * ms, end: 30 * ms, fault: Fault{Start: 0, End: 0}},
		{name: "call at 0 before the fault", start: 0, end: 0, fault: Fault{Start: 1 * ms, End: 2 * ms}},
		{name: "call and fault at 0", start: 0, end: 0, fault: Fault{Start: 0, End: 0}, named: true},
	}
	for _, tt := range tests {
		for _, limit := range []string{"", LimitFailover} {
			t.Run(fmt.Sprintf("%s/limit %q", tt.name, limit), func(t *testing.T) {
				h := NewHistory()
				f := tt.fault
				f.Name, f.Limit = "failover", limit
				h.AddFault(f)
				h.AddCall(ran(call("k", tt.start, tt.end, KindMismatch, ""), 1))
				r := Check(h)
				require.Equal(t, 1, r.FailClosed)
				v := r.Violations[0]
				if !tt.named {
					require.Empty(t, v.Faults)
					require.Empty(t, v.Limit)
					require.Zero(t, r.FromLimits)
					return
				}
				require.Equal(t, []string{"failover"}, v.Faults)
				require.Equal(t, limit, v.Limit)
				if limit != "" {
					require.Equal(t, 1, r.FromLimits)
				}
			})
		}
	}
}

// TestCheckReachBounds: the bounds of Fault.Reach are included: a call
// that begins as the crash ends began before its end, and one that ends as
// the crash begins ended after its start.
func TestCheckReachBounds(t *testing.T) {
	crash := Fault{Name: "crash", Limit: LimitAOFEverysec, Start: 5000 * ms, End: 5400 * ms, Reach: time.Second}
	tests := []struct {
		name  string
		calls [2][2]time.Duration
		limit bool
	}{
		{name: "began as the crash ended", calls: [2][2]time.Duration{{5400 * ms, 5450 * ms}, {5500 * ms, 5600 * ms}}, limit: true},
		{name: "began after the crash ended", calls: [2][2]time.Duration{{5401 * ms, 5450 * ms}, {5500 * ms, 5600 * ms}}},
		{name: "ended as the crash began", calls: [2][2]time.Duration{{4500 * ms, 4600 * ms}, {4700 * ms, 5000 * ms}}, limit: true},
		{name: "ended before the crash", calls: [2][2]time.Duration{{4500 * ms, 4600 * ms}, {4700 * ms, 4999 * ms}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := NewHistory()
			h.AddFault(crash)
			for i, c := range tt.calls {
				h.AddCall(ran(call("x", c[0], c[1], KindOK, "x"), 1))
				h.AddEffect(Effect{Key: "x", Fence: 1, Call: i, Accepted: true})
			}
			r := Check(h)
			require.Equal(t, 1, r.Duplicates)
			require.Equal(t, 1, r.Lost)
			require.Equal(t, 2, r.Total(), "%v", r.Violations)
			if tt.limit {
				require.Equal(t, 2, r.FromLimits)
			} else {
				require.Zero(t, r.FromLimits)
			}
		})
	}
}

// TestCheckStuckProbes: a probe refused as in progress, unavailable or
// cancelled after the faults healed is a key stuck (I4); one answered or
// failed by its function is not.
func TestCheckStuckProbes(t *testing.T) {
	h := NewHistory()
	for i, k := range []Kind{KindInProgress, KindUnavailable, KindCanceled, KindOK, KindFailed, KindPermanent} {
		h.AddCall(Call{Key: fmt.Sprint("k", i), Probe: true, Start: 0, End: ms, Kind: k})
	}
	r := Check(h)
	require.Equal(t, 3, r.Stuck)
	require.Equal(t, 3, r.Total())
	require.Equal(t, 6, r.Probes)
	for i, v := range r.Violations {
		require.Equal(t, I4, v.Invariant)
		require.Equal(t, []int{i}, callIDs(v))
	}
}

// TestCheckDetailBound: a Report describes at most 100 violations one by
// one; its counts cover all of them.
func TestCheckDetailBound(t *testing.T) {
	h := NewHistory()
	for i := range 150 {
		h.AddCall(ran(call(fmt.Sprint("k", i), 0, ms, KindInvalidKey, ""), 1))
	}
	r := Check(h)
	require.Equal(t, 150, r.FailClosed)
	require.Equal(t, 150, r.Total())
	require.Len(t, r.Violations, maxDetailed)
	require.Equal(t, 99, r.Violations[99].Calls[0].ID)
}

// TestCheckLatencies: P50 and P99 are the median and the 99th percentile
// of the finished calls' durations, probes and unfinished calls excluded.
func TestCheckLatencies(t *testing.T) {
	h := NewHistory()
	h.AddCall(call("a", 0, 0, KindOK, "a")) // a call that took no time counts
	h.AddCall(call("a", 5*ms, 15*ms, KindOK, "a"))
	h.AddCall(call("a", 30*ms, 50*ms, KindOK, "a"))
	h.AddCall(Call{Key: "a", Probe: true, Start: 0, End: time.Hour, Kind: KindOK, Result: "a"})
	h.AddCall(Call{Key: "b", Start: 0, End: -1})
	r := Check(h)
	require.Equal(t, 10*ms, r.P50)
	require.Equal(t, 20*ms, r.P99)

	h = NewHistory()
	for i := range 200 {
		h.AddCall(call("k", time.Duration(i)*ms, 2*time.Duration(i)*ms, KindOK, "k")) // took i ms
	}
	r = Check(h)
	require.Equal(t, 100*ms, r.P50)
	require.Equal(t, 198*ms, r.P99)

	r = Check(NewHistory())
	require.Zero(t, r.P50)
	require.Zero(t, r.P99)
}

// TestStartFault: a fault started is active (End -1) until its end
// function is called, which records the end once.
func TestStartFault(t *testing.T) {
	h := NewHistory()
	end := h.StartFault("partition", LimitFailover)
	f := h.Faults()
	require.Len(t, f, 1)
	require.Equal(t, Fault{Name: "partition", Limit: LimitFailover, Start: f[0].Start, End: -1}, f[0])
	end()
	ended := h.Faults()[0].End
	require.GreaterOrEqual(t, ended, f[0].Start)
	end()
	require.Equal(t, ended, h.Faults()[0].End, "the second call changes nothing")
}
