package verify

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The invariants Check verifies.
const (
	I1 = "I1" // at most one accepted effect per key
	I2 = "I2" // no divergent replay; no fail-closed error after fn ran
	I3 = "I3" // no handed-out result lost
	I4 = "I4" // after the faults heal, every key completes or is free
)

// maxDetailed bounds the violations a Report describes one by one; the
// counts cover all of them.
const maxDetailed = 100

// A Violation is one breach of an invariant.
type Violation struct {
	Invariant string   // I1 to I4
	What      string   // "duplicate effect", "lost result", ...
	Key       string   // the key
	Calls     []Call   // the calls involved, the earliest first
	Faults    []string // the faults active while they ran
	Limit     string   // the documented limit among those faults, or ""
}

// String describes the violation on one line.
func (v Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: key %q:", v.Invariant, v.What, v.Key)
	for i, c := range v.Calls {
		if i > 0 {
			b.WriteString(";")
		}
		fmt.Fprintf(&b, " call #%d", c.ID)
		if c.Via != "" {
			fmt.Fprintf(&b, " (%s)", c.Via)
		}
		if c.End < 0 {
			fmt.Fprintf(&b, " [%v–] unfinished", c.Start.Round(time.Microsecond))
		} else {
			fmt.Fprintf(&b, " [%v–%v] %s", c.Start.Round(time.Microsecond), c.End.Round(time.Microsecond), c.Kind)
		}
		if c.Ran {
			fmt.Fprintf(&b, ", fn ran at fence %d", c.Fence)
		}
		if c.Kind.Handed() {
			fmt.Fprintf(&b, ", got %q", c.Result)
		}
	}
	if len(v.Faults) == 0 {
		b.WriteString("; no fault active")
	} else {
		fmt.Fprintf(&b, "; during %s", strings.Join(v.Faults, ", "))
	}
	if v.Limit != "" {
		fmt.Fprintf(&b, "; from a documented limit of idem: %s (still a violation)", v.Limit)
	}
	return b.String()
}

// A Report is what Check found in a History.
type Report struct {
	Operations int // calls, probes included
	Probes     int
	Ran        int // calls whose function ran
	Unfinished int // calls without an end: their process was killed
	Effects    int // effects offered to the sink
	Fenced     int // effects the sink refused for a stale fence
	Faults     int

	Duplicates int // I1: accepted effects beyond the first of a key
	Divergent  int // I2: handed-out results that differ from the key's first
	FailClosed int // I2: fail-closed errors from calls whose function ran
	Lost       int // I3: calls that ran fn after a result had been handed out
	Stuck      int // I4: probes refused after the faults healed
	FromLimits int // violations during a documented limit

	Errors     map[Kind]int // outcomes other than ok, by kind
	Violations []Violation  // the first violations, in the order found
	P50, P99   time.Duration
	CheckTime  time.Duration
}

// Total returns the number of violations of every invariant.
func (r *Report) Total() int {
	return r.Duplicates + r.Divergent + r.FailClosed + r.Lost + r.Stuck
}

// OK reports whether the History violated no invariant.
func (r *Report) OK() bool { return r.Total() == 0 }

// keyState is what the check keeps per key.
type keyState struct {
	first    int // index of the first handed-out call by end, -1: none yet
	accepted int // index of the first accepted effect, -1: none yet
}

// Check verifies the invariants on h. It runs in time linear in the size of
// the history (plus the sort of the latencies it reports).
func Check(h *History) *Report {
	t0 := time.Now()
	calls, effects, faults := h.snapshot()
	r := &Report{Operations: len(calls), Effects: len(effects), Faults: len(faults), Errors: map[Kind]int{}}
	c := checker{r: r, calls: calls, faults: faults, keys: make(map[string]*keyState)}
	c.effects(effects)
	c.firstHanded()
	c.callsAfterFirst()
	r.P50, r.P99 = latencies(calls)
	r.CheckTime = time.Since(t0)
	return r
}

type checker struct {
	r      *Report
	calls  []Call
	faults []Fault
	keys   map[string]*keyState
}

func (c *checker) key(k string) *keyState {
	ks := c.keys[k]
	if ks == nil {
		ks = &keyState{first: -1, accepted: -1}
		c.keys[k] = ks
	}
	return ks
}

// effects checks I1: one accepted effect per key.
func (c *checker) effects(effects []Effect) {
	for i, e := range effects {
		if !e.Accepted {
			c.r.Fenced++
			continue
		}
		ks := c.key(e.Key)
		if ks.accepted < 0 {
			ks.accepted = i
			continue
		}
		c.r.Duplicates++
		c.violate(I1, "duplicate effect", e.Key, effects[ks.accepted].Call, e.Call)
	}
}

// firstHanded finds, per key, the call that handed out a result first (by
// its end), and counts outcomes.
func (c *checker) firstHanded() {
	for i, call := range c.calls {
		if call.Probe {
			c.r.Probes++
		}
		if call.Ran {
			c.r.Ran++
		}
		switch {
		case call.End < 0:
			// Its process was killed: it handed nothing out, but its
			// function counts as run and its effects as offered.
			c.r.Unfinished++
		case call.Kind != KindOK:
			c.r.Errors[call.Kind]++
		}
		if !call.Kind.Handed() {
			continue
		}
		ks := c.key(call.Key)
		if ks.first < 0 || call.End < c.calls[ks.first].End {
			ks.first = i
		}
	}
}

// callsAfterFirst checks I2, I3 and I4 call by call.
func (c *checker) callsAfterFirst() {
	for i, call := range c.calls {
		if call.Ran && call.Kind.FailClosed() {
			c.r.FailClosed++
			c.violate(I2, "fail-closed error after fn ran", call.Key, i)
		}
		if call.Probe && (call.Kind == KindInProgress || call.Kind == KindUnavailable || call.Kind == KindCanceled) {
			c.r.Stuck++
			c.violate(I4, "key neither completed nor free after the faults healed", call.Key, i)
		}
		ks := c.keys[call.Key]
		if ks == nil || ks.first < 0 || ks.first == i {
			continue
		}
		first := c.calls[ks.first]
		if call.Kind.Handed() && (call.Result != first.Result || call.Kind != first.Kind) {
			c.r.Divergent++
			c.violate(I2, "divergent replay", call.Key, ks.first, i)
		}
		if call.Ran && call.Start > first.End {
			c.r.Lost++
			c.violate(I3, "lost result: fn ran again after a result was handed out", call.Key, ks.first, i)
		}
	}
}

// violate records a violation of inv by the calls with indexes idx.
func (c *checker) violate(inv, what, key string, idx ...int) {
	v := Violation{Invariant: inv, What: what, Key: key}
	for _, i := range idx {
		if i < 0 || i >= len(c.calls) {
			continue // an effect of a call the history does not hold
		}
		v.Calls = append(v.Calls, c.calls[i])
	}
	lo, hi := span(v.Calls)
	for _, f := range c.faults {
		if f.Start <= hi && endOf(f.End) >= lo && !slices.Contains(v.Faults, f.Name) {
			v.Faults = append(v.Faults, f.Name)
		}
		if f.Limit != "" && v.Limit == "" && reaches(f, v.Calls) {
			v.Limit = f.Limit
		}
	}
	if v.Limit != "" {
		c.r.FromLimits++
	}
	if len(c.r.Violations) < maxDetailed {
		c.r.Violations = append(c.r.Violations, v)
	}
}

// endOf returns the end d, or a time after every other for -1 (no end).
func endOf(d time.Duration) time.Duration {
	if d < 0 {
		return 1 << 62
	}
	return d
}

// span returns the earliest start and the latest end of calls.
func span(calls []Call) (lo, hi time.Duration) {
	lo = 1 << 62
	for _, call := range calls {
		lo, hi = min(lo, call.Start), max(hi, endOf(call.End))
	}
	return lo, hi
}

// reaches reports whether the violation of calls falls within the
// documented limit of f: calls that ran while f was active, or, for a
// fault with a Reach, the pattern Fault.Reach describes.
func reaches(f Fault, calls []Call) bool {
	lo, hi := span(calls)
	if f.Reach <= 0 {
		return f.Start <= hi && endOf(f.End) >= lo
	}
	if len(calls) < 2 {
		return false
	}
	began, missed := false, false
	for _, call := range calls {
		if endOf(call.End) < f.Start-f.Reach {
			return false // acknowledged before the window
		}
		began = began || call.Start <= endOf(f.End)
		missed = missed || endOf(call.End) >= f.Start
	}
	return began && missed
}

// latencies returns the median and the 99th percentile of the calls'
// durations, probes excluded.
func latencies(calls []Call) (p50, p99 time.Duration) {
	d := make([]time.Duration, 0, len(calls))
	for _, c := range calls {
		if !c.Probe && c.End >= 0 {
			d = append(d, c.End-c.Start)
		}
	}
	if len(d) == 0 {
		return 0, 0
	}
	slices.Sort(d)
	return d[len(d)/2], d[len(d)*99/100] // len(d)*99/100 < len(d)
}
