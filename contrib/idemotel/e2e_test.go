package idemotel_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemotel"
	"github.com/idemkit/idem/idemstore"
)

// busyStore reports on busy every claim that found the key held, so that a
// test knows a duplicate is waiting without sleeping.
type busyStore struct {
	idemstore.Store
	busy chan struct{}
}

func (s *busyStore) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, id, c)
	if err == nil && res.Status == idemstore.ClaimBusy {
		select {
		case s.busy <- struct{}{}:
		default:
		}
	}
	return res, err
}

// requireChild requires child to be a child of parent.
func requireChild(t *testing.T, parent, child sdktrace.ReadOnlySpan) {
	t.Helper()
	require.Equal(t, parent.SpanContext().TraceID(), child.SpanContext().TraceID(), "%s in %s's trace", child.Name(), parent.Name())
	require.Equal(t, parent.SpanContext().SpanID(), child.Parent().SpanID(), "%s is a child of %s", child.Name(), parent.Name())
}

// opSpans returns the idem spans of an outcome.
func opSpans(tel *telemetry, name string, o idem.Outcome) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tel.spansNamed(name) {
		if spanAttrs(s)[idemotel.KeyOutcome].AsString() == string(o) {
			out = append(out, s)
		}
	}
	return out
}

func TestDoEndToEnd(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		tel := newTelemetry(t, idemotel.WithOperationID())
		g := b.Guard(idem.WithObserver(tel.obs))
		ctx, caller := tel.caller(context.Background())

		charge := func(ctx context.Context, a *idem.Attempt) (string, error) {
			_, span := tel.tp.Tracer("app").Start(ctx, "charge")
			defer span.End()
			return "ch_1", nil
		}

		// executed, then replayed, then mismatch.
		v, err := idem.Do(ctx, g, "order-1", "pay 10", charge)
		require.NoError(t, err)
		require.Equal(t, "ch_1", v)
		v, err = idem.Do(ctx, g, "order-1", "pay 10", charge)
		require.NoError(t, err)
		require.Equal(t, "ch_1", v)
		_, err = idem.Do(ctx, g, "order-1", "pay 99", charge)
		require.ErrorIs(t, err, idem.ErrMismatch)

		// released: fn failed, and the key is free again.
		boom := errors.New("card declined")
		_, err = idem.Do(ctx, g, "order-2", "pay 10", func(context.Context, *idem.Attempt) (string, error) {
			return "", boom
		})
		require.ErrorIs(t, err, boom)

		// released: fn panicked.
		require.Panics(t, func() {
			_, _ = idem.Do(ctx, g, "order-3", "pay 10", func(context.Context, *idem.Attempt) (string, error) {
				panic("bug")
			})
		})

		// in_progress: a duplicate while the first attempt runs.
		started, finish := make(chan struct{}), make(chan struct{})
		first := make(chan error, 1)
		go func() {
			_, err := idem.Do(ctx, g, "order-4", "pay 10", func(context.Context, *idem.Attempt) (string, error) {
				close(started)
				<-finish
				return "ch_4", nil
			})
			first <- err
		}()
		<-started
		_, err = idem.Do(ctx, g, "order-4", "pay 10", charge)
		require.ErrorIs(t, err, idem.ErrInProgress)
		close(finish)
		require.NoError(t, <-first)

		// canceled: the caller's context ended before the claim.
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err = idem.Do(cctx, g, "order-5", "pay 10", charge)
		require.ErrorIs(t, err, context.Canceled)

		// store_unavailable: the store is down.
		b.Store.Down.Store(true)
		_, err = idem.Do(ctx, g, "order-6", "pay 10", charge)
		require.ErrorIs(t, err, idem.ErrStoreUnavailable)
		b.Store.Down.Store(false)
		caller.End()

		m := tel.collect(t)
		require.Equal(t, map[series]int64{
			{"do", "executed"}:          2,
			{"do", "replayed"}:          1,
			{"do", "mismatch"}:          1,
			{"do", "released"}:          2,
			{"do", "in_progress"}:       1,
			{"do", "canceled"}:          1,
			{"do", "store_unavailable"}: 1,
		}, m.counts(t))
		require.Equal(t, uint64(2), m.hist(t, "idem.operation.duration")[series{"do", "executed"}].Count)
		require.Empty(t, m.hist(t, "idem.wait.duration"), "nothing waited")
		require.Equal(t, uint64(2), m.hist(t, "idem.store.duration")[series{"do", "executed"}].Count)

		// Every operation is a span, a child of the caller's; fn's spans are
		// children of the operation's.
		ops := tel.spansNamed("idem.do")
		require.Len(t, ops, 9)
		callerSpan := tel.spanNamed(t, "caller")
		for _, op := range ops {
			requireChild(t, callerSpan, op)
		}
		executed := opSpans(tel, "idem.do", idem.OutcomeExecuted)
		charges := tel.spansNamed("charge")
		require.Len(t, charges, 1, "fn ran once for order-1, not for the replay")
		requireChild(t, executed[0], charges[0])

		a := spanAttrs(executed[0])
		require.Equal(t, int64(1), a[idemotel.KeyFence].AsInt64())
		require.Equal(t, idem.OperationID(idem.KindDo, "", "order-1"), a[idemotel.KeyID].AsString())
		replayed := opSpans(tel, "idem.do", idem.OutcomeReplayed)[0]
		require.True(t, spanAttrs(replayed)[idemotel.KeyReplayed].AsBool())
		require.Equal(t, int64(1), spanAttrs(replayed)[idemotel.KeyFence].AsInt64(), "the stored record's fence")
		require.Equal(t, int64(1), spanAttrs(opSpans(tel, "idem.do", idem.OutcomeMismatch)[0])[idemotel.KeyFence].AsInt64())

		for _, op := range ops {
			o := idem.Outcome(spanAttrs(op)[idemotel.KeyOutcome].AsString())
			if o == idem.OutcomeStoreUnavailable {
				require.Equal(t, codes.Error, op.Status().Code)
				require.Contains(t, op.Status().Description, "connection refused")
				require.Len(t, op.Events(), 1)
			} else {
				require.Equal(t, codes.Unset, op.Status().Code, "%s", o)
			}
			for _, kv := range op.Attributes() {
				require.NotContains(t, kv.Value.String(), "order-", "no key in attributes")
			}
		}
	})
}

// completeStore fails every completion with err.
type completeStore struct {
	idemstore.Store
	err error
}

func (s *completeStore) Complete(context.Context, string, string, []byte, time.Duration) error {
	return s.err
}

// serverError is an error reply of Redis, as go-redis returns one.
type serverError string

func (e serverError) Error() string { return string(e) }
func (serverError) RedisError()     {}

// TestDoNotStoredEndToEnd: fn ran but its result was not stored, because
// the lease was lost, the store refused it, or did not answer in time (then
// it goes on in the background): the span's status is Error.
func TestDoNotStoredEndToEnd(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		for _, tc := range []struct {
			name    string
			err     error
			outcome idem.Outcome
		}{
			{name: "lease lost", err: idem.ErrLeaseLost, outcome: idem.OutcomeLeaseLost},
			{name: "store refused", err: serverError("ERR script failed"), outcome: idem.OutcomeNotRecorded},
			// Not answered: the completion goes on in the background.
			{name: "store failed", err: errors.New("i/o timeout"), outcome: idem.OutcomeRecording},
		} {
			t.Run(tc.name, func(t *testing.T) {
				tel := newTelemetry(t)
				g := idem.New(&completeStore{Store: b.Store, err: tc.err}, idem.WithObserver(tel.obs), idem.WithLease(200*time.Millisecond))
				t.Cleanup(func() { require.NoError(t, g.Drain(context.Background())) })
				_, err := idem.Do(context.Background(), g, "order-"+string(tc.outcome), "pay 10",
					func(context.Context, *idem.Attempt) (string, error) { return "ch_1", nil })
				require.ErrorIs(t, err, idem.ErrNotRecorded)
				require.Equal(t, map[series]int64{{"do", string(tc.outcome)}: 1}, tel.collect(t).counts(t))
				op := tel.spanNamed(t, "idem.do")
				require.Equal(t, string(tc.outcome), spanAttrs(op)[idemotel.KeyOutcome].AsString())
				require.Equal(t, codes.Error, op.Status().Code)
				require.Equal(t, err.Error(), op.Status().Description)
				require.Len(t, op.Events(), 1)
			})
		}
	})
}

func TestDoWaitEndToEnd(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		tel := newTelemetry(t)
		store := &busyStore{Store: b.Store, busy: make(chan struct{}, 1)}
		g := idem.New(store, idem.WithObserver(tel.obs), idem.WithWait(time.Minute))
		ctx := context.Background()

		started, finish := make(chan struct{}), make(chan struct{})
		first := make(chan error, 1)
		go func() {
			_, err := idem.Do(ctx, g, "order-1", "pay 10", func(context.Context, *idem.Attempt) (string, error) {
				close(started)
				<-finish
				return "ch_1", nil
			})
			first <- err
		}()
		<-started
		second := make(chan error, 1)
		go func() {
			v, err := idem.Do(ctx, g, "order-1", "pay 10", func(context.Context, *idem.Attempt) (string, error) {
				return "ch_2", nil
			})
			if err == nil && v != "ch_1" {
				err = errors.New("the duplicate got " + v)
			}
			second <- err
		}()
		<-store.busy // the duplicate found the key held: it waits
		close(finish)
		require.NoError(t, <-first)
		require.NoError(t, <-second)

		m := tel.collect(t)
		require.Equal(t, map[series]int64{{"do", "executed"}: 1, {"do", "replayed"}: 1}, m.counts(t))
		waits := m.hist(t, "idem.wait.duration")
		require.Len(t, waits, 1, "only the duplicate waited")
		require.Equal(t, uint64(1), waits[series{"do", "replayed"}].Count)
		require.Positive(t, waits[series{"do", "replayed"}].Sum)
	})
}

func TestOnceEndToEnd(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		tel := newTelemetry(t)
		g := b.Guard(idem.WithObserver(tel.obs))
		ctx, caller := tel.caller(context.Background())
		handle := func(ctx context.Context) error {
			_, span := tel.tp.Tracer("app").Start(ctx, "handle message")
			span.End()
			return nil
		}
		ran, err := g.Once(ctx, "msg-1", handle)
		require.NoError(t, err)
		require.True(t, ran)
		ran, err = g.Once(ctx, "msg-1", handle)
		require.NoError(t, err)
		require.False(t, ran)
		_, err = g.Once(ctx, "", handle)
		require.ErrorIs(t, err, idem.ErrInvalidKey)
		caller.End()

		require.Equal(t, map[series]int64{
			{"once", "executed"}:    1,
			{"once", "replayed"}:    1,
			{"once", "invalid_key"}: 1,
		}, tel.collect(t).counts(t))
		executed := opSpans(tel, "idem.once", idem.OutcomeExecuted)
		require.Len(t, executed, 1)
		requireChild(t, tel.spanNamed(t, "caller"), executed[0])
		requireChild(t, executed[0], tel.spanNamed(t, "handle message"))
		require.Len(t, tel.spansNamed("idem.once"), 3)
	})
}

func TestMiddlewareEndToEnd(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		tel := newTelemetry(t)
		g := b.Guard(idem.WithObserver(tel.obs))
		mux := http.NewServeMux()
		mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
			_, span := tel.tp.Tracer("app").Start(r.Context(), "create order")
			defer span.End()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"id":1}`))
		})
		mux.HandleFunc("POST /fail", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "down", http.StatusBadGateway)
		})
		// server stands for an HTTP server instrumentation (otelhttp): a
		// server span around the middleware.
		protected := g.Middleware()(mux)
		server := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx, span := tel.tp.Tracer("app").Start(r.Context(), "server "+r.URL.Path, trace.WithSpanKind(trace.SpanKindServer))
			defer span.End()
			protected.ServeHTTP(w, r.WithContext(ctx))
		})

		send := func(path, key, body string) *httptest.ResponseRecorder {
			req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if key != "" {
				req.Header.Set("Idempotency-Key", key)
			}
			w := httptest.NewRecorder()
			server.ServeHTTP(w, req)
			return w
		}
		require.Equal(t, http.StatusCreated, send("/orders", "k1", `{"n":1}`).Code)
		w := send("/orders", "k1", `{"n":1}`)
		require.Equal(t, http.StatusCreated, w.Code)
		require.Equal(t, "true", w.Header().Get(idem.ReplayedHeader))
		require.Equal(t, http.StatusUnprocessableEntity, send("/orders", "k1", `{"n":2}`).Code)
		require.Equal(t, http.StatusBadRequest, send("/orders", "", `{"n":1}`).Code)
		require.Equal(t, http.StatusBadGateway, send("/fail", "k2", `{}`).Code)
		b.Store.Down.Store(true)
		require.Equal(t, http.StatusServiceUnavailable, send("/orders", "k3", `{}`).Code)
		b.Store.Down.Store(false)

		m := tel.collect(t)
		require.Equal(t, map[series]int64{
			{"http", "executed"}:          1,
			{"http", "replayed"}:          1,
			{"http", "mismatch"}:          1,
			{"http", "invalid_key"}:       1,
			{"http", "released"}:          1,
			{"http", "store_unavailable"}: 1,
		}, m.counts(t))
		require.Len(t, m.hist(t, "idem.operation.duration"), 6)

		ops := tel.spansNamed("idem.http")
		require.Len(t, ops, 6)
		servers := map[trace.SpanID]bool{}
		for _, s := range tel.spans.Ended() {
			if s.SpanKind() == trace.SpanKindServer {
				servers[s.SpanContext().SpanID()] = true
			}
		}
		for _, op := range ops {
			require.True(t, servers[op.Parent().SpanID()], "the idem span is a child of the server span")
		}
		executed := opSpans(tel, "idem.http", idem.OutcomeExecuted)
		require.Len(t, executed, 1)
		require.Equal(t, int64(1), spanAttrs(executed[0])[idemotel.KeyFence].AsInt64())
		requireChild(t, executed[0], tel.spanNamed(t, "create order"))
		unavailable := opSpans(tel, "idem.http", idem.OutcomeStoreUnavailable)
		require.Len(t, unavailable, 1)
		require.Equal(t, codes.Error, unavailable[0].Status().Code)
		require.Equal(t, attribute.StringValue("http"), spanAttrs(unavailable[0])[idemotel.KeyKind])
	})
}
