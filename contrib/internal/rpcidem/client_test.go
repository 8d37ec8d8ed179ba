package rpcidem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemclient"
)

// callError is a failed call's error in these tests; readFailure reads it
// as a module reads its protocol's status.
type callError struct {
	f       Failure
	attempt int
}

func (e *callError) Error() string { return fmt.Sprintf("code %d on attempt %d", e.f.Code, e.attempt) }

func readFailure(err error) (Failure, bool) {
	if e, ok := errors.AsType[*callError](err); ok {
		return e.f, true
	}
	return Failure{}, false
}

// sender is a call that fails with its failures in turn, then succeeds. It
// fails the test rather than loop when sent more than 50 times.
type sender struct {
	t     *testing.T
	fails []Failure
	sent  int
}

func (s *sender) send(attempt int) error {
	s.sent++
	require.Equal(s.t, s.sent, attempt, "attempts count from 1")
	if s.sent > 50 {
		s.t.Errorf("sent %d times", s.sent)
		return nil
	}
	if s.sent <= len(s.fails) {
		return &callError{f: s.fails[s.sent-1], attempt: attempt}
	}
	return nil
}

// always returns n copies of f.
func always(f Failure, n int) []Failure {
	fs := make([]Failure, n)
	for i := range fs {
		fs[i] = f
	}
	return fs
}

// endsOnWait is a context that ends (context.Canceled) the moment Retry
// waits on it: a test sees whether Retry would wait, without waiting.
type endsOnWait struct {
	context.Context
	once  sync.Once
	done  chan struct{}
	ended atomic.Bool
}

func newEndsOnWait(parent context.Context) *endsOnWait {
	return &endsOnWait{Context: parent, done: make(chan struct{})}
}

func (c *endsOnWait) Done() <-chan struct{} {
	c.once.Do(func() { c.ended.Store(true); close(c.done) })
	return c.done
}

func (c *endsOnWait) Err() error {
	if c.ended.Load() {
		return context.Canceled
	}
	return nil
}

// quick is a client whose backoff waits at most a nanosecond.
func quick(opts ...func(*ClientConfig)) *Client {
	return NewClient(append([]func(*ClientConfig){func(c *ClientConfig) { c.SetBackoff(1, 1) }}, opts...))
}

var (
	unavailable = Failure{Code: CodeUnavailable}
	retryNow    = Failure{Code: CodeAborted, HasRetryInfo: true}
)

// TestRetryWhichErrors: Unavailable is retried, with or without a
// RetryInfo, and Aborted with a RetryInfo; every other error, Aborted
// without a RetryInfo among them, is returned as it is.
func TestRetryWhichErrors(t *testing.T) {
	for _, tc := range []struct {
		f     Failure
		retry bool
	}{
		{unavailable, true},
		{Failure{Code: CodeUnavailable, HasRetryInfo: true, RetryDelay: time.Millisecond}, true},
		{retryNow, true},
		{Failure{Code: CodeAborted, HasRetryInfo: true, RetryDelay: -time.Second}, true},
		{Failure{Code: CodeAborted}, false},
		{Failure{Code: CodeInvalidArgument}, false},
		{Failure{Code: CodeInternal, HasRetryInfo: true}, false},
		{Failure{Code: 8, HasRetryInfo: true}, false}, // ResourceExhausted
		{Failure{Code: 4}, false},                     // DeadlineExceeded
	} {
		s := &sender{t: t, fails: []Failure{tc.f}}
		err, ended := quick().Retry(t.Context(), s.send, readFailure)
		require.False(t, ended)
		if tc.retry {
			require.NoError(t, err, "%+v", tc.f)
			require.Equal(t, 2, s.sent, "%+v", tc.f)
		} else {
			require.Equal(t, &callError{f: tc.f, attempt: 1}, err, "%+v", tc.f)
			require.Equal(t, 1, s.sent, "%+v", tc.f)
		}
	}
}

// TestRetryNotAStatus: an error that is not a status is returned at once.
func TestRetryNotAStatus(t *testing.T) {
	plain := errors.New("connection reset")
	sent := 0
	err, ended := quick().Retry(t.Context(), func(int) error { sent++; return plain }, readFailure)
	require.Same(t, plain, err)
	require.False(t, ended)
	require.Equal(t, 1, sent)
}

// TestRetryMaxAttempts: a call is sent at most WithMaxAttempts times (5 by
// default, values below 1 mean 1), and the last attempt's error is
// returned.
func TestRetryMaxAttempts(t *testing.T) {
	for _, tc := range []struct {
		opts []func(*ClientConfig)
		want int
	}{
		{nil, 5},
		{[]func(*ClientConfig){func(c *ClientConfig) { c.SetMaxAttempts(3) }}, 3},
		{[]func(*ClientConfig){func(c *ClientConfig) { c.SetMaxAttempts(1) }}, 1},
		{[]func(*ClientConfig){func(c *ClientConfig) { c.SetMaxAttempts(0) }}, 1},
		{[]func(*ClientConfig){func(c *ClientConfig) { c.SetMaxAttempts(-2) }}, 1},
	} {
		for _, f := range []Failure{unavailable, retryNow} {
			s := &sender{t: t, fails: always(f, 10)}
			err, ended := quick(tc.opts...).Retry(t.Context(), s.send, readFailure)
			require.False(t, ended)
			require.Equal(t, tc.want, s.sent, "%+v", f)
			require.Equal(t, &callError{f: f, attempt: tc.want}, err)
		}
	}
	s := &sender{t: t, fails: always(retryNow, 4)}
	err, _ := quick().Retry(t.Context(), s.send, readFailure)
	require.NoError(t, err, "the fifth attempt of five succeeds")
	require.Equal(t, 5, s.sent)
}

// TestRetryDelayLimit: the client waits for a RetryInfo delay of up to 30s;
// an error asking for longer is returned at once.
func TestRetryDelayLimit(t *testing.T) {
	for _, code := range []uint32{CodeAborted, CodeUnavailable} {
		ctx := newEndsOnWait(t.Context())
		s := &sender{t: t, fails: always(Failure{Code: code, HasRetryInfo: true, RetryDelay: 30 * time.Second}, 10)}
		err, ended := quick().Retry(ctx, s.send, readFailure)
		require.True(t, ended, "30s is waited for")
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, 1, s.sent)

		ctx = newEndsOnWait(t.Context())
		f := Failure{Code: code, HasRetryInfo: true, RetryDelay: 30*time.Second + 1}
		s = &sender{t: t, fails: always(f, 10)}
		err, ended = quick().Retry(ctx, s.send, readFailure)
		require.False(t, ended)
		require.False(t, ctx.ended.Load(), "a longer delay is not waited for")
		require.Equal(t, &callError{f: f, attempt: 1}, err)
		require.Equal(t, 1, s.sent)
	}
}

// TestRetryWithinDeadline: the client does not start a wait that the
// call's deadline would end, and retries when the deadline leaves time.
func TestRetryWithinDeadline(t *testing.T) {
	far, cancel := context.WithTimeout(t.Context(), time.Hour)
	defer cancel()
	s := &sender{t: t, fails: []Failure{retryNow, unavailable}}
	err, ended := quick().Retry(far, s.send, readFailure)
	require.NoError(t, err)
	require.False(t, ended)
	require.Equal(t, 3, s.sent)

	near, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ctx := newEndsOnWait(near)
	f := Failure{Code: CodeAborted, HasRetryInfo: true, RetryDelay: 20 * time.Second}
	s = &sender{t: t, fails: always(f, 10)}
	err, ended = quick().Retry(ctx, s.send, readFailure)
	require.False(t, ended)
	require.False(t, ctx.ended.Load(), "no wait past the deadline")
	require.Equal(t, &callError{f: f, attempt: 1}, err, "the server's answer, not the deadline's")
	require.Equal(t, 1, s.sent)
}

// TestRetryContextEnds: when the call's context ends during a wait, Retry
// returns the context's error and ended; when it ended during the attempt,
// the attempt's error is returned and there is no retry.
func TestRetryContextEnds(t *testing.T) {
	for _, f := range []Failure{unavailable, {Code: CodeAborted, HasRetryInfo: true, RetryDelay: time.Second}} {
		ctx := newEndsOnWait(t.Context())
		s := &sender{t: t, fails: always(f, 10)}
		err, ended := NewClient[func(*ClientConfig)](nil).Retry(ctx, s.send, readFailure)
		require.True(t, ended)
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, 1, s.sent)
	}

	ctx, cancel := context.WithCancel(t.Context())
	s := &sender{t: t, fails: always(retryNow, 10)}
	err, ended := quick().Retry(ctx, func(attempt int) error { cancel(); return s.send(attempt) }, readFailure)
	require.False(t, ended)
	require.Equal(t, &callError{f: retryNow, attempt: 1}, err)
	require.Equal(t, 1, s.sent)
}

// TestNewClientOptions: the defaults (5 attempts, backoff from 200ms to
// 10s) and how WithBackoff and WithMaxAttempts change them; nil options are
// skipped.
func TestNewClientOptions(t *testing.T) {
	c := NewClient[func(*ClientConfig)](nil)
	require.Equal(t, ClientConfig{attempts: 5, backoff: backoff{base: 200 * time.Millisecond, limit: 10 * time.Second}}, c.cfg)

	backoffOf := func(base, limit time.Duration) backoff {
		return NewClient([]func(*ClientConfig){nil, func(c *ClientConfig) { c.SetBackoff(base, limit) }, nil}).cfg.backoff
	}
	require.Equal(t, backoff{base: time.Second, limit: time.Minute}, backoffOf(time.Second, time.Minute))
	require.Equal(t, backoff{base: 200 * time.Millisecond, limit: 5 * time.Second}, backoffOf(0, 5*time.Second), "a zero base keeps the default")
	require.Equal(t, backoff{base: 200 * time.Millisecond, limit: 5 * time.Second}, backoffOf(-time.Second, 5*time.Second), "a negative base keeps the default")
	require.Equal(t, backoff{base: time.Second, limit: time.Second}, backoffOf(time.Second, time.Millisecond), "a limit below the base is raised to it")
	require.Equal(t, backoff{base: 200 * time.Millisecond, limit: 200 * time.Millisecond}, backoffOf(0, 0))

	c = NewClient([]func(*ClientConfig){func(c *ClientConfig) { c.SetMaxAttempts(7) }, nil})
	require.Equal(t, 7, c.cfg.attempts)
}

// TestSendKey: a call sends the key set by idemclient.WithKey, checked, or
// else a new key of its own.
func TestSendKey(t *testing.T) {
	key, err := SendKey(idemclient.WithKey(t.Context(), "order-17"))
	require.NoError(t, err)
	require.Equal(t, "order-17", key)

	_, err = SendKey(idemclient.WithKey(t.Context(), "caf\xc3\xa9"))
	require.ErrorIs(t, err, idem.ErrInvalidKey)

	a, err := SendKey(t.Context())
	require.NoError(t, err)
	b, err := SendKey(t.Context())
	require.NoError(t, err)
	require.NotEmpty(t, a)
	require.NotEqual(t, a, b, "a new key per call")
}
