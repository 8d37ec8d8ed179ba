package idem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// The fail-fast state machine (storeHealth), by itself: closed, open after
// failRun failures in a row or a budget without an answer, one probe at a
// time every probeEvery, closed by any answer.

var errDown = errors.New("connection refused")

// fail reports a failed call sent at sent.
func fail(h *storeHealth, sent time.Time) {
	probe, err := h.admit()
	if err != nil {
		panic(err)
	}
	h.report(probe, sent, callFailed, errDown, time.Hour)
}

// TestHealthOpensAfterFailRun: failRun failures in a row make the store
// failing; an answer between them starts the count again.
func TestHealthOpensAfterFailRun(t *testing.T) {
	h := newStoreHealth()
	for range failRun - 1 {
		fail(h, time.Now())
	}
	require.False(t, h.failing())
	h.report(false, time.Now(), callAnswered, nil, time.Hour)
	for range failRun - 1 {
		fail(h, time.Now())
	}
	require.False(t, h.failing(), "an answer started the count again")
	fail(h, time.Now())
	require.True(t, h.failing())
	_, err := h.admit()
	var fe *failingError
	require.ErrorAs(t, err, &fe)
	require.ErrorIs(t, err, ErrStoreUnavailable)
	require.ErrorContains(t, err, "connection refused", "the refusal names the last failure")
}

// TestHealthOpensAfterABudget: one failure of a call that waited a whole
// budget (or follows the first failure by one) is enough: the store has not
// answered for as long as any caller may wait.
func TestHealthOpensAfterABudget(t *testing.T) {
	h := newStoreHealth()
	probe, err := h.admit()
	require.NoError(t, err)
	h.report(probe, time.Now().Add(-time.Second), callFailed, errWriteTimeout, time.Second)
	require.True(t, h.failing(), "a call that waited its whole budget")
}

// TestHealthIgnoresDropped: calls the caller left, or that never went out,
// say nothing about the store.
func TestHealthIgnoresDropped(t *testing.T) {
	h := newStoreHealth()
	for range 10 * failRun {
		h.report(false, time.Now(), callDropped, context.Canceled, time.Hour)
	}
	require.False(t, h.failing())
}

// TestHealthProbes: a failing store lets one call through every probeEvery,
// one at a time; a failed probe waits another probeEvery; an answer, from
// the probe or from a call sent before, ends the failing state and wakes
// the writes waiting on answered.
func TestHealthProbes(t *testing.T) {
	h := newStoreHealth()
	for range failRun {
		fail(h, time.Now())
	}
	require.True(t, h.failing())
	back := h.answered()
	require.NotNil(t, back)

	// Within probeEvery of the last failure: refused.
	_, err := h.admit()
	require.Error(t, err)
	h.mu.Lock()
	h.nextProbe = time.Now() // the pause is over
	h.mu.Unlock()
	probe, err := h.admit()
	require.NoError(t, err)
	require.True(t, probe)
	_, err = h.admit()
	require.Error(t, err, "one probe at a time")
	h.report(probe, time.Now(), callFailed, errDown, time.Hour)
	_, err = h.admit()
	require.Error(t, err, "a failed probe: the next one after probeEvery")
	require.True(t, h.failing())

	h.mu.Lock()
	h.nextProbe = time.Now()
	h.mu.Unlock()
	probe, err = h.admit()
	require.NoError(t, err)
	select {
	case <-back:
		t.Fatal("woken before an answer")
	default:
	}
	h.report(probe, time.Now(), callAnswered, ErrLeaseLost, time.Hour) // an answer, whatever it says
	require.False(t, h.failing())
	<-back
	require.Nil(t, h.answered(), "nothing to wait for")
	probe, err = h.admit()
	require.NoError(t, err)
	require.False(t, probe)
}

// TestHealthWatchers: every change of state is told once, with the last
// failure when failing.
func TestHealthWatchers(t *testing.T) {
	h := newStoreHealth()
	var mu sync.Mutex
	var got []string
	h.watch(func(s StoreState, err error) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, fmt.Sprint(s, " ", err))
	})
	for range 2 * failRun {
		h.report(false, time.Now(), callFailed, errDown, time.Hour)
	}
	h.report(false, time.Now(), callAnswered, nil, time.Hour)
	h.report(false, time.Now(), callAnswered, nil, time.Hour)
	require.Equal(t, []string{"failing connection refused", "ok <nil>"}, got)
}

// TestHealthConcurrent: many callers failing and answering at once leave the
// state machine consistent (-race), and one answer at the end closes it.
func TestHealthConcurrent(t *testing.T) {
	h := newStoreHealth()
	var wg sync.WaitGroup
	var probes atomic.Int32
	for i := range 8 {
		wg.Go(func() {
			for j := range 500 {
				probe, err := h.admit()
				if err != nil {
					continue
				}
				if probe {
					probes.Add(1)
				}
				end := callFailed
				if (i+j)%7 == 0 {
					end = callAnswered
				}
				h.report(probe, time.Now(), end, errDown, time.Hour)
			}
		})
	}
	wg.Wait()
	h.report(false, time.Now(), callAnswered, nil, time.Hour)
	require.False(t, h.failing())
}

// TestClassify: what counts as the store not answering.
func TestClassify(t *testing.T) {
	for _, c := range []struct {
		err  error
		want callEnd
	}{
		{ErrLeaseLost, callAnswered},
		{fmt.Errorf("x: %w", ErrUnreadable), callAnswered},
		{&unackedError{n: 0, want: 1}, callAnswered},
		{redis.ErrClosed, callFailed},
		{proto("ERR idem: record of an unknown format"), callAnswered},
		{proto("NOPERM this user has no permissions"), callAnswered},
		{proto("LOADING Redis is loading the dataset in memory"), callFailed},
		{proto("MASTERDOWN Link with MASTER is down"), callFailed},
		{proto("CLUSTERDOWN The cluster is down"), callFailed},
		{proto("READONLY You can't write against a read only replica."), callFailed},
		{proto("BUSY Redis is busy running a script."), callFailed},
		{fmt.Errorf("%w: x", errWriteTimeout), callFailed},
		{context.DeadlineExceeded, callFailed},
		{&net.OpError{Op: "dial", Err: errDown}, callFailed},
		{io.EOF, callFailed},
		{&failingError{last: errDown}, callDropped},
		{fmt.Errorf("%w: a nil *RedisStore", ErrStoreUnavailable), callDropped},
	} {
		require.Equal(t, c.want, classify(c.err), "%v", c.err)
	}
}

// TestMayHaveRun: which failed calls may still run on the server, and so
// need taking back.
func TestMayHaveRun(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{&failingError{last: errDown}, false},
		{&net.OpError{Op: "dial", Err: errDown}, false},
		{redis.ErrPoolTimeout, false},
		{proto("LOADING Redis is loading"), false},
		{&unackedError{}, false},
		{fmt.Errorf("%w: a nil client", ErrStoreUnavailable), false},
		{fmt.Errorf("%w: x", errWriteTimeout), true},
		{&net.OpError{Op: "read", Err: errDown}, true},
		{io.EOF, true},
		{context.Canceled, true},
	} {
		require.Equal(t, c.want, mayHaveRun(c.err), "%v", c.err)
	}
}

// proto is a server's error reply, as go-redis returns it.
type proto string

func (e proto) Error() string { return string(e) }
func (proto) RedisError()     {}
