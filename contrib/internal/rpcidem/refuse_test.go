package rpcidem

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// bound is how long a test waits for another goroutine before it fails.
const bound = 10 * time.Second

// recv returns what ch delivers, failing the test after bound.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(bound):
		t.Fatalf("no %s after %v", what, bound)
		panic("unreachable")
	}
}

// TestRunInProgress: a repeat while the first call runs, on a Guard without
// WithWait, is refused with Aborted and ReasonInProgress, with the default
// retry delay of 1s; the first call's answer then replays.
func TestRunInProgress(t *testing.T) {
	s := newServer(newStore(), nil)
	started, release := make(chan struct{}), make(chan struct{})
	h := &handler{answer: func(context.Context) ([]byte, error) {
		close(started)
		<-release
		return textCodec.RecordMessage("first", true)
	}}
	first := make(chan Outcome[string, string], 1)
	go func() { first <- s.Run(context.Background(), methodCharge, "r", keyed("k-1"), h.handle) }()
	recv(t, started, "first run")

	o := s.Run(t.Context(), methodCharge, "r", keyed("k-1"), h.handle)
	close(release)
	require.NotNil(t, o.Refused)
	require.Equal(t, CodeAborted, o.Refused.Code)
	require.Equal(t, ReasonInProgress, o.Refused.Reason)
	require.Equal(t, time.Second, o.Refused.RetryDelay)
	require.Contains(t, o.Refused.Message, "still running")

	require.True(t, recv(t, first, "first answer").Ran)
	require.Equal(t, Outcome[string, string]{Message: "first"}, s.Run(t.Context(), methodCharge, "r", keyed("k-1"), h.handle))
	require.Equal(t, 1, h.count())
}

// TestRunInProgressDelay: the RetryInfo delay is WithRetryDelay's (zero or
// negative keeps the default 1s), capped by the time left on the first
// call's lease, and never below a millisecond.
func TestRunInProgressDelay(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  []option
		lease time.Duration // the first call's lease left
		want  time.Duration
	}{
		{"default", nil, 30 * time.Second, time.Second},
		{"set", []option{func(c *ServerConfig) { c.SetRetryDelay(250 * time.Millisecond) }}, 30 * time.Second, 250 * time.Millisecond},
		{"zero keeps the default", []option{func(c *ServerConfig) { c.SetRetryDelay(0) }}, 30 * time.Second, time.Second},
		{"negative keeps the default", []option{func(c *ServerConfig) { c.SetRetryDelay(-time.Second) }}, 30 * time.Second, time.Second},
		{"capped by the lease", []option{func(c *ServerConfig) { c.SetRetryDelay(5 * time.Second) }}, 300 * time.Millisecond, 300 * time.Millisecond},
		{"at least 1ms", nil, 0, time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newStore()
			st.claim = func(context.Context) (idemstore.ClaimResult, error) {
				return idemstore.ClaimResult{Status: idemstore.ClaimBusy, RetryAfter: tc.lease}, nil
			}
			h := answering("x")
			o := newServer(st, nil, tc.opts...).Run(t.Context(), methodCharge, "r", keyed("k-1"), h.handle)
			require.NotNil(t, o.Refused)
			require.Equal(t, ReasonInProgress, o.Refused.Reason)
			require.Equal(t, tc.want, o.Refused.RetryDelay)
			require.Zero(t, h.count())
		})
	}
}

// TestRunConcurrentDuplicates: calls with one key sent at once, on a Guard
// with WithWait, run the handler once; every other call gets its response.
func TestRunConcurrentDuplicates(t *testing.T) {
	s := newServer(newStore(), []idem.Option{idem.WithWait(bound)})
	release := make(chan struct{})
	h := &handler{answer: func(ctx context.Context) ([]byte, error) {
		<-release
		a, _ := idem.AttemptFrom(ctx)
		return textCodec.RecordMessage("charged once, attempt "+a.ID, true)
	}}
	const n = 16
	outcomes := make(chan Outcome[string, string], n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { outcomes <- s.Run(context.Background(), methodCharge, "amount=10", keyed("k-1"), h.handle) })
	}
	close(release)
	wg.Wait()
	close(outcomes)
	ran, replayed := 0, map[string]int{}
	for o := range outcomes {
		require.Nil(t, o.Refused)
		if o.Ran {
			ran++
			continue
		}
		replayed[o.Message]++
	}
	require.Equal(t, 1, ran)
	require.Equal(t, 1, h.count(), "the side effect happens once")
	require.Equal(t, map[string]int{"charged once, attempt " + h.attempt.ID: n - 1}, replayed)
}

// TestRunStoreFailures: when idem.Do fails before the handler runs, the
// call is refused: Unavailable (ReasonStoreUnavailable) when the store is
// unreachable, the context's cause when the call's context ended, and
// Internal, logged, for anything else.
func TestRunStoreFailures(t *testing.T) {
	log := captureLog(t)
	st := newStore()
	s := newServer(st, nil)
	h := answering("x")

	st.claim = func(context.Context) (idemstore.ClaimResult, error) {
		return idemstore.ClaimResult{}, errors.New("dial tcp 10.0.0.7:6379: connection refused")
	}
	o := s.Run(t.Context(), methodCharge, "r", keyed("k-1"), h.handle)
	require.Equal(t, &Refusal{Code: CodeUnavailable, Reason: ReasonStoreUnavailable,
		Message: "idem: the idempotency store is unreachable, so the call was not run; retry with the same key"}, o.Refused)

	st.claim = func(context.Context) (idemstore.ClaimResult, error) {
		return idemstore.ClaimResult{}, idem.ErrUnreadable
	}
	o = s.Run(t.Context(), methodCharge, "r", keyed("k-1"), h.handle)
	require.Equal(t, &Refusal{Code: CodeInternal, Message: idem.ErrUnreadable.Error()}, o.Refused)
	require.Contains(t, log.String(), "rpctest: call refused")
	require.Contains(t, log.String(), "method="+methodCharge)

	st.claim = nil
	gone := errors.New("client went away")
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(gone)
	o = s.Run(ctx, methodCharge, "r", keyed("k-1"), h.handle)
	require.Equal(t, &Refusal{Cause: gone}, o.Refused)
	require.Zero(t, h.count())
}

// TestNewServerPanics: a nil Guard, or invalid options, make the
// constructor panic with a message naming it and every invalid option;
// nil options are skipped.
func TestNewServerPanics(t *testing.T) {
	require.PanicsWithValue(t, "rpctest: NewInterceptor with a nil Guard", func() {
		NewServer[string, string, option](testProtocol, textCodec, nil, nil)
	})
	g := idem.New(newStore())
	require.PanicsWithValue(t, `rpctest: NewInterceptor: WithScope(nil); WithKeyFunc(nil); WithRequiredKey with no method; `+
		`WithRequiredKey: "/Charge" is not a full method (/pkg.Service/Method); `+
		`WithRequiredKey: "//Charge" is not a full method (/pkg.Service/Method); `+
		`WithRequiredKey: "pay.v1.Payments/Charge" is not a full method (/pkg.Service/Method); `+
		`WithRequiredKey: "/pay.v1.Payments/" is not a full method (/pkg.Service/Method); `+
		`WithRequiredKey: "" is not a full method (/pkg.Service/Method)`, func() {
		NewServer(testProtocol, textCodec, g, []option{
			func(c *ServerConfig) { c.SetScope(nil) },
			nil,
			func(c *ServerConfig) { c.SetKeyFunc(nil) },
			func(c *ServerConfig) { c.Require(testProtocol, nil) },
			func(c *ServerConfig) {
				c.Require(testProtocol, []string{"/Charge", "//Charge", "pay.v1.Payments/Charge", "/pay.v1.Payments/", ""})
			},
		})
	})
	s := NewServer(testProtocol, textCodec, g, []option{nil, func(c *ServerConfig) {
		c.Require(testProtocol, []string{"/a/b", methodCharge})
		c.SetScope(func(context.Context) string { return "t" })
		c.SetKeyFunc(func(context.Context, any) (string, bool) { return "", false })
		c.SetRetryDelay(time.Minute)
	}})
	require.Equal(t, map[string]bool{"/a/b": true, methodCharge: true}, s.cfg.required)
	require.Equal(t, time.Minute, s.cfg.retry)
}
