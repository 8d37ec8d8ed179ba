package canonjson

import (
	"fmt"
	"runtime/debug"
	"testing"
	"time"
)

// callBound bounds each call of Append in the tests: far beyond what any of
// their inputs takes (a megabyte at most: 60 ms under the race detector),
// even on a loaded machine, and far within the test binary's timeout (and
// within a mutation tester's, ten times a run of the package's tests),
// so that a loop fails the test that reached it, naming its input, instead
// of hanging the run.
const callBound = 3 * time.Second

// appendBounded returns Append(dst, src), or fails the test if Append
// panics or has not returned after callBound (the call is then left
// running: the test binary ends with the failure).
func appendBounded(t testing.TB, dst, src []byte) ([]byte, bool) {
	t.Helper()
	type result struct {
		out   []byte
		ok    bool
		panic any
	}
	done := make(chan result, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- result{panic: fmt.Sprintf("%v\n%s", r, debug.Stack())}
			}
		}()
		out, ok := Append(dst, src)
		done <- result{out: out, ok: ok}
	}()
	timer := time.NewTimer(callBound)
	defer timer.Stop()
	select {
	case r := <-done:
		if r.panic != nil {
			t.Fatalf("Append(%.100q) panicked: %v", src, r.panic)
		}
		return r.out, r.ok
	case <-timer.C:
		t.Fatalf("Append(%.100q) has not returned after %v: it loops", src, callBound)
		return nil, false
	}
}
