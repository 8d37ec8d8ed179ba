package jsonptr

import (
	"fmt"
	"runtime/debug"
	"testing"
	"time"
)

// callBound bounds each call of Parse and Find in the tests: far beyond
// what any of their inputs takes (microseconds), even under the race
// detector on a loaded machine, and far within the test binary's timeout,
// so that a loop (an index moved backwards) fails the test that reached
// it, naming its input, instead of hanging the run. Find promises not to
// loop on any input.
const callBound = 5 * time.Second

// within runs f, failing the test if f panics or has not returned after
// callBound (f is then left running: the test binary ends with the
// failure). format and args name the call.
func within(t testing.TB, f func(), format string, args ...any) {
	t.Helper()
	done := make(chan any, 1) // what f panicked with, or nil
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Sprintf("%v\n%s", r, debug.Stack())
			}
		}()
		f()
		done <- nil
	}()
	timer := time.NewTimer(callBound)
	defer timer.Stop()
	select {
	case r := <-done:
		if r != nil {
			t.Fatalf("%s panicked: %v", fmt.Sprintf(format, args...), r)
		}
	case <-timer.C:
		t.Fatalf("%s has not returned after %v: it loops", fmt.Sprintf(format, args...), callBound)
	}
}

// parse is Parse(s), under callBound.
func parse(t testing.TB, s string) (p Pointer, err error) {
	t.Helper()
	within(t, func() { p, err = Parse(s) }, "Parse(%q)", s)
	return p, err
}

// find is p.Find(doc), under callBound.
func find(t testing.TB, p Pointer, doc []byte) (v []byte, err error) {
	t.Helper()
	within(t, func() { v, err = p.Find(doc) }, "Find(%q, %.100q)", p.String(), doc)
	return v, err
}
