package verify

import (
	"sync"
	"time"
)

// A pacer spaces the calls of a Workload at most rate a second, shared by
// all its workers: the calls that have started by any time t number at
// most rate × (t − t0) + 1, where t0 is the first call's start. A burst of
// n concurrent duplicates takes n consecutive slots and starts at the last
// of them, all together. Time lost (a slow server, a busy machine) is not
// made up later with a burst.
type pacer struct {
	mu   sync.Mutex
	next time.Time // the earliest slot of the next call
}

// reserve takes n consecutive slots, the first no earlier than now, at
// one call every 1s/rate (rounded up, so never faster than rate), and
// returns when the n calls may start: at their last slot.
func (p *pacer) reserve(now time.Time, rate, n int) time.Time {
	every := (time.Second + time.Duration(rate) - 1) / time.Duration(rate)
	p.mu.Lock()
	defer p.mu.Unlock()
	first := p.next
	if first.Before(now) {
		first = now
	}
	start := first.Add(time.Duration(n-1) * every)
	p.next = start.Add(every)
	return start
}
