package idem_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/idemtest"
)

// recObserver records what an Observer is told. Start puts the kind in the
// context, so that tests see fn run under the context Start returned.
type recObserver struct {
	mu     sync.Mutex
	starts int
	events []idem.Event
	ctxOK  []bool // End got the context Start returned
}

type obsKey struct{}

func (o *recObserver) Start(ctx context.Context, kind idem.Kind) context.Context {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.starts++
	return context.WithValue(ctx, obsKey{}, kind)
}

func (o *recObserver) End(ctx context.Context, e idem.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events = append(o.events, e)
	o.ctxOK = append(o.ctxOK, ctx.Value(obsKey{}) == e.Kind)
}

// last returns the only event since the previous call, checking that it
// was started, and ended with the context Start returned.
func (o *recObserver) last(t *testing.T) idem.Event {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	require.Len(t, o.events, 1, "one End per operation")
	require.Positive(t, o.starts, "Start before End")
	require.True(t, o.ctxOK[0], "End gets the context Start returned")
	e := o.events[0]
	o.events, o.ctxOK = nil, nil
	o.starts--
	return e
}

func TestObserverDoOutcomes(t *testing.T) {
	forEachBackend(t, testObserverDoOutcomes)
}

func testObserverDoOutcomes(t *testing.T, b *backend) {
	ctx := t.Context()
	obs := &recObserver{}
	g := b.guard(t, idem.WithObserver(obs))
	req := payment{Amount: 1, Currency: "EUR"}
	sawKind := false
	_, err := idem.Do(ctx, g, "k1", req, func(ctx context.Context, a *idem.Attempt) (string, error) {
		sawKind = ctx.Value(obsKey{}) == idem.KindDo
		return "r", nil
	})
	require.NoError(t, err)
	require.True(t, sawKind, "fn runs under the context Start returned")
	e := obs.last(t)
	require.Equal(t, idem.OutcomeExecuted, e.Outcome)
	require.Equal(t, idem.KindDo, e.Kind)
	require.Equal(t, int64(1), e.Fence)
	require.Len(t, e.ID, 22)
	require.Positive(t, e.Duration)
	require.Positive(t, e.Store)
	require.LessOrEqual(t, e.Store, e.Duration, "the store's share of the call")
	require.Zero(t, e.Wait)

	_, err = idem.Do(ctx, g, "k1", req, okFn("other"))
	require.NoError(t, err)
	e = obs.last(t)
	require.Equal(t, idem.OutcomeReplayed, e.Outcome)
	require.Equal(t, int64(1), e.Fence, "a replay reports the record's fence")

	_, err = idem.Do(ctx, g, "k1", payment{Amount: 2}, okFn("other"))
	require.ErrorIs(t, err, idem.ErrMismatch)
	e = obs.last(t)
	require.Equal(t, idem.OutcomeMismatch, e.Outcome)
	require.Equal(t, int64(1), e.Fence, "a mismatch reports the record's fence")
	require.ErrorIs(t, e.Err, idem.ErrMismatch)

	boom := errors.New("boom")
	_, err = idem.Do(ctx, g, "k2", req, func(context.Context, *idem.Attempt) (string, error) { return "", boom })
	require.ErrorIs(t, err, boom)
	e = obs.last(t)
	require.Equal(t, idem.OutcomeReleased, e.Outcome)
	require.ErrorIs(t, e.Err, boom)

	_, err = idem.Do(ctx, g, "k3", req, func(context.Context, *idem.Attempt) (string, error) {
		return "", idem.Permanent(boom)
	})
	require.ErrorIs(t, err, idem.ErrPermanent)
	require.Equal(t, idem.OutcomeExecuted, obs.last(t).Outcome, "a Permanent error is a stored result")

	_, err = idem.Do(ctx, g, "", req, okFn("r"))
	require.ErrorIs(t, err, idem.ErrInvalidKey)
	e = obs.last(t)
	require.Equal(t, idem.OutcomeInvalidKey, e.Outcome)
	require.Empty(t, e.ID)

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = idem.Do(cctx, g, "k4", req, okFn("r"))
	require.Error(t, err)
	require.Equal(t, idem.OutcomeCanceled, obs.last(t).Outcome)

	require.Panics(t, func() {
		_, _ = idem.Do(ctx, g, "k5", req, func(context.Context, *idem.Attempt) (string, error) { panic("fn") })
	})
	require.Equal(t, idem.OutcomeReleased, obs.last(t).Outcome, "a panic is ended as released")
}

func TestObserverInProgressAndWait(t *testing.T) {
	ctx := t.Context()
	obs := &recObserver{}
	store := &claimCounter{Store: idemtest.NewMemoryStore(), claims: make(chan struct{}, 100)}
	g := idem.New(store, idem.WithObserver(obs), quiet)
	gw := idem.New(store, idem.WithObserver(obs), quiet, idem.WithWait(5*time.Second))
	running, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := idem.Do(ctx, g, "k", "req", func(context.Context, *idem.Attempt) (string, error) {
			close(running)
			<-finish
			return "first", nil
		})
		done <- err
	}()
	<-running
	_, err := idem.Do(ctx, g, "k", "req", okFn("second"))
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.Equal(t, idem.OutcomeInProgress, obs.last(t).Outcome)

	waited := make(chan string, 1)
	go func() {
		v, _ := idem.Do(ctx, gw, "k", "req", okFn("second"))
		waited <- v
	}()
	// The waiter polls the memory store: its polls are not operations.
	for range 5 { // the first attempt's and the in-progress claim, then the waiter's first claim and two polls
		<-store.claims
	}
	close(finish)
	require.NoError(t, <-done)
	require.Equal(t, "first", <-waited)
	obs.mu.Lock()
	events := obs.events
	obs.events, obs.ctxOK, obs.starts = nil, nil, 0
	obs.mu.Unlock()
	require.Len(t, events, 2, "the first attempt and the waiter, whatever the waiter's polls")
	var w idem.Event
	for _, e := range events {
		if e.Outcome == idem.OutcomeReplayed {
			w = e
		}
	}
	require.Equal(t, idem.OutcomeReplayed, w.Outcome)
	// Two polls were seen, each sent when its timer fired (the first after
	// 25ms, the next 50ms later; a timer never fires early), so the wait
	// reported covers at least those 75ms however late the goroutines ran.
	require.GreaterOrEqual(t, w.Wait, 75*time.Millisecond)
}

// claimCounter signals every claim.
type claimCounter struct {
	idemstore.Store
	claims chan struct{}
}

func (s *claimCounter) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	s.claims <- struct{}{}
	return s.Store.Claim(ctx, id, c)
}

func TestObserverStoreFaults(t *testing.T) {
	ctx := t.Context()
	obs := &recObserver{}
	log, logged := recordingLogger()
	st := &faultyStore{Store: idemtest.NewMemoryStore(), fail: map[string]error{"Complete": errors.New("connection reset")}}
	g := idem.New(st, idem.WithObserver(obs), idem.WithLogger(log), idem.WithLease(200*time.Millisecond))
	_, err := idem.Do(ctx, g, "k", "req", okFn("r"))
	require.ErrorIs(t, err, idem.ErrNotRecorded)
	require.Equal(t, idem.OutcomeRecording, obs.last(t).Outcome, "the completion goes on in the background")
	require.Contains(t, logged(), "event=result_pending")
	require.NoError(t, g.Drain(ctx)) // tried until the lease ends
	require.Contains(t, logged(), "event=result_not_recorded")

	// The store's failures made it failing for g: a new Guard.
	st.fail = map[string]error{"Complete": idem.ErrLeaseLost}
	g = idem.New(st, idem.WithObserver(obs), idem.WithLogger(log))
	_, err = idem.Do(ctx, g, "k1", "req", okFn("r"))
	require.ErrorIs(t, err, idem.ErrNotRecorded)
	require.Equal(t, idem.OutcomeLeaseLost, obs.last(t).Outcome)

	st.fail = map[string]error{"Heartbeat": idem.ErrLeaseLost}
	g = idem.New(st, idem.WithObserver(obs), idem.WithLogger(log), idem.WithLease(30*time.Millisecond))
	_, err = idem.Do(ctx, g, "k2", "req", func(ctx context.Context, _ *idem.Attempt) (string, error) {
		<-ctx.Done()
		return "", context.Cause(ctx)
	})
	require.ErrorIs(t, err, idem.ErrLeaseLost)
	require.Equal(t, idem.OutcomeLeaseLost, obs.last(t).Outcome)
	require.Contains(t, logged(), "event=lease_lost")

	g = idem.New(nil, idem.WithObserver(obs), quiet)
	_, err = idem.Do(ctx, g, "k3", "req", okFn("r"))
	require.ErrorIs(t, err, idem.ErrStoreUnavailable)
	require.Equal(t, idem.OutcomeStoreUnavailable, obs.last(t).Outcome)
}

func TestObserverOnce(t *testing.T) {
	forEachBackend(t, testObserverOnce)
}

func testObserverOnce(t *testing.T, b *backend) {
	ctx := t.Context()
	obs := &recObserver{}
	g := b.guard(t, idem.WithObserver(obs))
	ran, err := g.Once(ctx, "m1", func(ctx context.Context) error {
		require.Equal(t, idem.KindOnce, ctx.Value(obsKey{}))
		return nil
	})
	require.True(t, ran)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, obs.last(t).Outcome)
	ran, err = g.Once(ctx, "m1", func(context.Context) error { return nil })
	require.False(t, ran)
	require.NoError(t, err)
	e := obs.last(t)
	require.Equal(t, idem.OutcomeReplayed, e.Outcome)
	require.Equal(t, idem.KindOnce, e.Kind)
}

// panicObserver panics in both methods.
type panicObserver struct{}

func (panicObserver) Start(context.Context, idem.Kind) context.Context { panic("start") }
func (panicObserver) End(context.Context, idem.Event)                  { panic("end") }

func TestObserverPanicStaysOut(t *testing.T) {
	log, logged := recordingLogger()
	g := idemtest.NewGuard(idem.WithObserver(panicObserver{}), idem.WithLogger(log))
	v, err := idem.Do(t.Context(), g, "k", "req", okFn("r"))
	require.NoError(t, err)
	require.Equal(t, "r", v)
	rr := httptest.NewRecorder()
	g.Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok"))
	})).ServeHTTP(rr, keyed(httptest.NewRequest("POST", "/pay", strings.NewReader("{}")), "h1"))
	require.Equal(t, 200, rr.Code)
	require.Contains(t, logged(), "event=observer_panic")
}

func keyed(r *http.Request, key string) *http.Request {
	r.Header.Set(idem.DefaultKeyHeader, key)
	return r
}

func TestObserverHTTPOutcomes(t *testing.T) {
	forEachBackend(t, testObserverHTTPOutcomes)
}

func testObserverHTTPOutcomes(t *testing.T, b *backend) {
	obs := &recObserver{}
	g := b.guard(t, idem.WithObserver(obs))
	status := http.StatusCreated
	h := g.Middleware(idem.WithMaxRequestBody(64))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			require.Equal(t, idem.KindHTTP, r.Context().Value(obsKey{}), "the handler runs under Start's context")
		}
		w.WriteHeader(status)
	}))
	serve := func(r *http.Request) idem.Event {
		t.Helper()
		h.ServeHTTP(httptest.NewRecorder(), r)
		return obs.last(t)
	}
	post := func(key, body string) *http.Request {
		return keyed(httptest.NewRequest("POST", "/pay", strings.NewReader(body)), key)
	}
	e := serve(post("a", "{}"))
	require.Equal(t, idem.OutcomeExecuted, e.Outcome)
	require.Equal(t, idem.KindHTTP, e.Kind)
	require.Equal(t, idem.OutcomeReplayed, serve(post("a", "{}")).Outcome)
	require.Equal(t, idem.OutcomeMismatch, serve(post("a", `{"x":1}`)).Outcome)
	require.Equal(t, idem.OutcomeInvalidKey, serve(httptest.NewRequest("POST", "/pay", nil)).Outcome, "missing key")
	require.Equal(t, idem.OutcomeInvalidKey, serve(post(strings.Repeat("k", 300), "{}")).Outcome)
	require.Equal(t, idem.OutcomeTooLarge, serve(post("b", strings.Repeat("x", 100))).Outcome)
	status = http.StatusServiceUnavailable
	require.Equal(t, idem.OutcomeReleased, serve(post("c", "{}")).Outcome, "a 5xx is released")

	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/pay", nil))
	obs.mu.Lock()
	require.Zero(t, obs.starts, "an unprotected method is not an operation")
	obs.mu.Unlock()
}

// unopenable seals as is and opens nothing.
type unopenable struct{}

func (unopenable) Seal(p, _ []byte) ([]byte, error) { return append([]byte(nil), p...), nil }
func (unopenable) Open([]byte, []byte) ([]byte, error) {
	return nil, errors.New("no key")
}

func TestObserverUnreadable(t *testing.T) {
	obs := &recObserver{}
	g := idemtest.NewGuard(idem.WithObserver(obs), idem.WithSealer(unopenable{}), quiet)
	_, err := idem.Do(t.Context(), g, "k", "req", okFn("r"))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, obs.last(t).Outcome)
	_, err = idem.Do(t.Context(), g, "k", "req", okFn("r"))
	require.ErrorIs(t, err, idem.ErrUnreadable)
	require.Equal(t, idem.OutcomeUnreadable, obs.last(t).Outcome)
}
