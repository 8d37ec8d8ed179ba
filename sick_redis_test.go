//go:build unix

package idem_test

// A sick Redis costs a request its store budget, and nothing after. Redis
// stops answering in two ways here: the server frozen (SIGSTOP, as a stalled
// host or a long fork looks to a client), and a network that stops
// forwarding bytes (a frozen redistest.Proxy, a partition). Whatever the
// go-redis options, Do, Once and the middleware refuse a request within the
// budget (WithStoreTimeout) and do not run it; the claim such a request sent
// and never heard back from is released by its owner once Redis answers
// again, so the retry the refusal invited runs at once, as attempt 1.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redistest"
)

const (
	// sickBudget is the store budget of these tests.
	sickBudget = 200 * time.Millisecond
	// sickBound is how long a request may take while Redis does not answer:
	// ten budgets, generous for a loaded 2-core machine, and far below the
	// seconds that go-redis's own timeouts and retries add up to.
	sickBound = 10 * sickBudget
	// sickRecovery bounds how long the retries of a refused request may
	// keep being refused after Redis answers again: a hang guard, far beyond
	// the fail-fast probe's half second.
	sickRecovery = 10 * time.Second
)

// sickClients are the go-redis configurations the budget must hold for:
// with ContextTimeoutEnabled go-redis returns by a context's deadline;
// without it, it waits its ReadTimeout (3 s) and retries (3 times).
var sickClients = []struct {
	name       string
	ctxTimeout bool
}{
	{name: "ContextTimeoutEnabled", ctxTimeout: true},
	{name: "go-redis defaults", ctxTimeout: false},
}

// sickFaults are the ways Redis stops answering.
var sickFaults = []string{"SIGSTOP", "partition"}

// sickRedis is a private redis-server, reached directly or through a proxy,
// that a test makes stop answering and answer again.
type sickRedis struct {
	t     *testing.T
	srv   *redistest.Server
	proxy *redistest.Proxy // nil: clients dial srv
	fault string
}

// startSick starts a redis-server for fault ("SIGSTOP" or "partition").
func startSick(t *testing.T, fault string) *sickRedis {
	t.Helper()
	s := &sickRedis{t: t, srv: redistest.Start(t), fault: fault}
	if fault == "partition" {
		s.proxy = redistest.StartProxy(t, s.srv.Addr())
	}
	return s
}

// addr is the address clients dial.
func (s *sickRedis) addr() string {
	if s.proxy != nil {
		return s.proxy.Addr()
	}
	return s.srv.Addr()
}

// client returns a go-redis client on go-redis's defaults, but for
// ContextTimeoutEnabled, closed by the test's cleanup.
func (s *sickRedis) client(ctxTimeout bool) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.addr(), ContextTimeoutEnabled: ctxTimeout})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// guard returns a Guard on a new client, with the store budget sickBudget
// unless opts set another.
func (s *sickRedis) guard(ctxTimeout bool, opts ...idem.Option) *idem.Guard {
	opts = append([]idem.Option{quiet, idem.WithStoreTimeout(sickBudget)}, opts...)
	return idem.New(idem.NewRedisStore(s.client(ctxTimeout), idem.WithPrefix("idem")), opts...)
}

// freeze makes Redis stop answering; the test's cleanup ends the freeze.
func (s *sickRedis) freeze() {
	s.t.Helper()
	if s.proxy != nil {
		s.proxy.Freeze()
		s.t.Cleanup(s.proxy.Thaw)
		return
	}
	s.srv.Pause(s.t)
	s.t.Cleanup(func() {
		if s.srv.Running() {
			s.srv.Resume(s.t)
		}
	})
}

// resume ends the freeze and returns the moment Redis answered a PING
// again, through the address the Guards use.
func (s *sickRedis) resume() time.Time {
	s.t.Helper()
	if s.proxy != nil {
		s.proxy.Thaw()
	} else {
		s.srv.Resume(s.t)
	}
	return answering(s.t, s.addr())
}

// answering polls addr with PING on a client of its own until it answers,
// and returns when it did.
func answering(t *testing.T, addr string) time.Time {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1,
		DialTimeout: 100 * time.Millisecond, ReadTimeout: 100 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(sickRecovery)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return time.Now()
		}
		require.True(t, time.Now().Before(deadline), "Redis on %s does not answer PING: %v", addr, err)
		time.Sleep(5 * time.Millisecond) // the next probe
	}
}

// sickOutcome is what one request through an entry point got.
type sickOutcome struct {
	err      error // Do's and Once's error; for HTTP, the sentinel its status stands for
	ran      bool  // the function or handler ran in this request
	fence    int64 // the Attempt's fence, when it ran (not under Once)
	replayed bool  // the answer is the stored one
}

// sickEntry is an entry point: it sends one request with key through g.
type sickEntry struct {
	name string
	call func(t *testing.T, g *idem.Guard, key string) sickOutcome
}

var sickEntries = []sickEntry{
	{name: "Do", call: sickDo},
	{name: "Once", call: sickOnce},
	{name: "Middleware", call: sickMiddleware},
}

func sickDo(t *testing.T, g *idem.Guard, key string) sickOutcome {
	var o sickOutcome
	v, err := idem.Do(context.Background(), g, key, payment{Amount: 1}, func(ctx context.Context, a *idem.Attempt) (string, error) {
		o.ran, o.fence = true, a.Fence
		return "v-" + key, nil
	})
	o.err = err
	if err == nil {
		require.Equal(t, "v-"+key, v)
		o.replayed = !o.ran
	}
	return o
}

func sickOnce(t *testing.T, g *idem.Guard, key string) sickOutcome {
	var o sickOutcome
	ran, err := g.Once(context.Background(), key, func(context.Context) error {
		o.ran = true
		return nil
	})
	require.Equal(t, o.ran, ran, "Once reports whether fn ran")
	o.err = err
	o.replayed = err == nil && !ran
	return o
}

// sickMiddleware posts to a handler behind g.Middleware() and maps the
// answer: 503 store-unavailable (with Retry-After) to ErrStoreUnavailable,
// 409 to ErrInProgress, the handler's 201 (or its replay) to nil.
func sickMiddleware(t *testing.T, g *idem.Guard, key string) sickOutcome {
	var o sickOutcome
	h := g.Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, ok := idem.AttemptFrom(r.Context())
		require.True(t, ok)
		o.ran, o.fence = true, a.Fence
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"key":%q}`, key)
	}))
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":1}`))
	r.Header.Set("Idempotency-Key", key)
	h.ServeHTTP(rec, r)
	switch rec.Code {
	case http.StatusServiceUnavailable:
		requireProblem(t, rec, http.StatusServiceUnavailable, "store-unavailable")
		require.NotEmpty(t, rec.Header().Get("Retry-After"), "a 503 says when to retry")
		o.err = idem.ErrStoreUnavailable
	case http.StatusConflict:
		o.err = &idem.InProgressError{}
	case http.StatusCreated:
		var body struct{ Key string }
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
		require.Equal(t, key, body.Key)
		o.replayed = rec.Header().Get(idem.ReplayedHeader) == "true"
	default:
		o.err = fmt.Errorf("status %d: %s", rec.Code, rec.Body)
	}
	return o
}

// timed runs f and returns how long it took.
func timed[T any](f func() T) (T, time.Duration) {
	start := time.Now()
	v := f()
	return v, time.Since(start)
}

// warm completes one request with a key of its own, so that g's client has
// a connection and the scripts are loaded before Redis stops answering.
func warm(t *testing.T, e sickEntry, g *idem.Guard) {
	t.Helper()
	// A loaded machine may miss the short budget: a refused warm-up is
	// sent again (the Redis is healthy; nothing here is under test).
	for try := 0; ; try++ {
		o := e.call(t, g, "warm-"+e.name)
		if errors.Is(o.err, idem.ErrStoreUnavailable) && try < 20 {
			time.Sleep(sickBudget)
			continue
		}
		require.NoError(t, o.err)
		require.True(t, o.ran)
		return
	}
}

// TestFrozenRedisRefusedWithinBudget: while Redis does not answer, a new
// key through Do, Once and the middleware is refused with
// ErrStoreUnavailable (503 store-unavailable with Retry-After) within the
// store budget, whatever the go-redis options, and its function does not
// run.
func TestFrozenRedisRefusedWithinBudget(t *testing.T) {
	for _, e := range sickEntries {
		for _, fault := range sickFaults {
			for _, c := range sickClients {
				t.Run(e.name+"/"+fault+"/"+c.name, func(t *testing.T) {
					s := startSick(t, fault)
					g := s.guard(c.ctxTimeout)
					warm(t, e, g)
					s.freeze()
					o, took := timed(func() sickOutcome { return e.call(t, g, "frozen-1") })
					t.Logf("refused after %v (budget %v)", took.Round(time.Millisecond), sickBudget)
					require.ErrorIs(t, o.err, idem.ErrStoreUnavailable)
					require.NotErrorIs(t, o.err, idem.ErrNotRecorded)
					require.False(t, o.ran, "the function does not run")
					require.Less(t, took, sickBound, "answered within the budget (%v) plus scheduling", sickBudget)
				})
			}
		}
	}
}

// untilAnswered calls f until it returns anything but ErrStoreUnavailable,
// for at most sickRecovery, and returns that: once Redis answers again, a
// call that a loaded machine did not answer within the budget is refused,
// and a client sends it again.
func untilAnswered(t *testing.T, f func() error) error {
	t.Helper()
	deadline := time.Now().Add(sickRecovery)
	for {
		err := f()
		if !errors.Is(err, idem.ErrStoreUnavailable) || errors.Is(err, idem.ErrNotRecorded) {
			return err
		}
		require.True(t, time.Now().Before(deadline), "still refused %v after Redis answered: %v", sickRecovery, err)
		time.Sleep(10 * time.Millisecond) // a client's pause between retries
	}
}
