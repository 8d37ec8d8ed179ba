package idem

import (
	"slices"
	"sync/atomic"
	"time"
)

// A store batches only while its callers queue, for the client's or the
// server's CPU or a busy link: then one batch for many calls saves every
// side a write, a read and a wake-up per call, and the callers get their
// replies sooner. Where they only wait on the network, a batch saves
// nothing they would wait for, and costs each of them a hand-off between
// goroutines and the others' time on the way.
//
// Queueing shows as calls that take longer than the round trip itself. A
// store sends its calls directly and times them, in windows of loadWindow
// calls. The quickest calls of a window (its 5th percentile) stand for
// the round trip; the store keeps the least of them over the last
// loadPeriod or two, the floor. When the median call of loadStrikes
// windows in a row takes over queueFactor times the floor, the callers
// queue: the store batches for a while (at least loadHold, and at least
// loadHoldWindows times a window's length), then sends directly again for
// one window to see whether they still queue; if they do, it batches again
// at once. Only calls sent directly are timed: batching shortens the
// queues it is measured by.
const (
	loadWindow      = 256
	loadSkip        = 32 // of a window: calls that may have been made while batching
	queueFactor     = 1.5
	loadPeriod      = 10 * time.Second
	loadHold        = time.Second
	loadHoldWindows = 16
	loadStrikes     = 2
)

// roundTrips times a store's direct calls to tell whether its callers
// queue (see loadWindow). It takes no lock: a window's calls write their
// own slots, and the call that fills the window judges it; the judging
// calls follow one another (n orders them), and they alone use the plain
// fields.
type roundTrips struct {
	epoch    time.Time    // origin of the times below (monotonic)
	batching atomic.Bool  // the callers queued in the last windows judged
	until    atomic.Int64 // while batching: when to time a window again
	started  atomic.Int64 // when the current window began
	probing  atomic.Bool  // the current window follows a spell of batching
	n        atomic.Int32 // calls timed in the current window
	window   [loadWindow]atomic.Int64

	strikes          int   // windows in a row that queued
	floor, floorPrev int64 // this period's and the last one's; 0: none
	periodEnd        int64
}

func newRoundTrips() *roundTrips { return &roundTrips{epoch: time.Now()} }

// now returns the time since r's epoch. It reads the monotonic clock alone,
// at half the cost of time.Now, which reads the wall clock too: a store
// that may batch reads it twice per call.
func (r *roundTrips) now() time.Duration { return time.Since(r.epoch) }

// busy reports whether calls should ride batches: the callers queued when
// last measured.
func (r *roundTrips) busy() bool { return r.batching.Load() }

// took counts a call made at start that had its reply at end (both times
// since r's epoch, see now); direct tells whether it was sent directly
// rather than in a batch.
func (r *roundTrips) took(start, end time.Duration, direct bool) {
	at := int64(end)
	if r.batching.Load() {
		if at >= r.until.Load() && r.batching.CompareAndSwap(true, false) {
			r.started.Store(at) // a window of direct calls begins
			r.probing.Store(true)
		}
		return
	}
	if !direct {
		return
	}
	i := r.n.Add(1) - 1
	if i >= loadWindow {
		return // being judged
	}
	r.window[i].Store(int64(end - start))
	if i == loadWindow-1 {
		r.judge(at)
	}
}

// judge decides from a full window whether the store batches, and opens
// the next window.
func (r *roundTrips) judge(at int64) {
	var buf [loadWindow]int64
	v := buf[:0]
	for i := range r.window {
		// A slot a late call had not written yet holds 0.
		if d := r.window[i].Swap(0); d > 0 && i >= loadSkip {
			v = append(v, d)
		}
	}
	probing := r.probing.Swap(false)
	defer func() {
		r.started.Store(at)
		r.n.Store(0)
	}()
	if len(v) < loadWindow/2 {
		return
	}
	slices.Sort(v)
	if at >= r.periodEnd {
		r.floorPrev, r.floor, r.periodEnd = r.floor, 0, at+int64(loadPeriod)
	}
	if q := v[len(v)/20]; r.floor == 0 || q < r.floor {
		r.floor = q
	}
	floor := r.floor
	if r.floorPrev != 0 {
		floor = min(floor, r.floorPrev)
	}
	if float64(v[len(v)/2]) <= queueFactor*float64(floor) {
		r.strikes = 0
		return
	}
	if r.strikes++; r.strikes < loadStrikes && !probing {
		return
	}
	r.strikes = 0
	hold := max(int64(loadHold), loadHoldWindows*(at-r.started.Load()))
	r.until.Store(at + hold)
	r.batching.Store(true)
}
