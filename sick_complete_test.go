//go:build unix

package idem_test

// A completion Redis does not answer within the store budget: the function
// (or the handler) ran, and Redis stopped answering before its result was
// stored. The caller gets the result within the budget, marked
// ErrNotRecorded (the handler's own response, not a replay, under the
// middleware); the Guard goes on storing it in the background, Drain waits
// for that, and once Redis answers a repeat gets the stored answer: nothing
// answered to a client is lost, and the function ran once.

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// drainTimeout bounds Drain after Redis answers again: a hang guard.
const drainTimeout = 10 * time.Second

// TestCompletionNotStoredInBudget: Do returns fn's value with ErrNotRecorded
// within the budget of fn's return while Redis does not answer; after Redis
// answers, Drain returns nil and a repeat replays the value without running
// fn again.
func TestCompletionNotStoredInBudget(t *testing.T) {
	for _, fault := range sickFaults {
		for _, c := range sickClients {
			t.Run(fault+"/"+c.name, func(t *testing.T) {
				s := startSick(t, fault)
				g := s.guard(c.ctxTimeout)
				ctx := context.Background()
				warm(t, sickEntries[0], g)
				runs := 0
				var returned time.Time
				fn := func(context.Context, *idem.Attempt) (string, error) {
					runs++
					s.freeze() // after fn's work, before its completion
					returned = time.Now()
					return "charged", nil
				}
				v, err := idem.Do(ctx, g, "k", payment{Amount: 5}, fn)
				took := time.Since(returned)
				t.Logf("answered %v after fn returned", took.Round(time.Millisecond))
				require.Equal(t, "charged", v, "fn's value comes back")
				require.ErrorIs(t, err, idem.ErrNotRecorded)
				require.NotErrorIs(t, err, idem.ErrLeaseLost)
				require.Less(t, took, sickBound, "answered within the budget (%v) plus scheduling", sickBudget)

				s.resume()
				dctx, cancel := context.WithTimeout(ctx, drainTimeout)
				defer cancel()
				require.NoError(t, g.Drain(dctx), "the completion was stored in the background")
				err = untilAnswered(t, func() error {
					var err error
					v, err = idem.Do(ctx, g, "k", payment{Amount: 5}, fn)
					return err
				})
				require.NoError(t, err)
				require.Equal(t, "charged", v, "the repeat replays the stored value")
				require.Equal(t, 1, runs, "fn ran once")
			})
		}
	}
}

// TestCompletionNotStoredInBudgetMiddleware: the client gets the handler's
// 201 within the budget of the handler's return while Redis does not
// answer; after Redis answers and Drain returns, a retry gets the same
// answer replayed (Idempotent-Replayed: true), and the handler ran once.
func TestCompletionNotStoredInBudgetMiddleware(t *testing.T) {
	for _, fault := range sickFaults {
		for _, c := range sickClients {
			t.Run(fault+"/"+c.name, func(t *testing.T) {
				s := startSick(t, fault)
				g := s.guard(c.ctxTimeout)
				warm(t, sickEntries[2], g)
				runs := 0
				var returned time.Time
				h := g.Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs++
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusCreated)
					_, _ = w.Write([]byte(`{"id":"pay_1"}`))
					s.freeze() // the handler is done; the middleware holds its response
					returned = time.Now()
				}))
				post := func() *httptest.ResponseRecorder {
					rec := httptest.NewRecorder()
					r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":5}`))
					r.Header.Set("Idempotency-Key", "k")
					h.ServeHTTP(rec, r)
					return rec
				}
				rec := post()
				took := time.Since(returned)
				t.Logf("answered %v after the handler returned", took.Round(time.Millisecond))
				require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
				require.Equal(t, `{"id":"pay_1"}`, rec.Body.String(), "the handler's own response")
				require.Empty(t, rec.Header().Get(idem.ReplayedHeader))
				require.Less(t, took, sickBound, "answered within the budget (%v) plus scheduling", sickBudget)

				s.resume()
				ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
				defer cancel()
				require.NoError(t, g.Drain(ctx), "the completion was stored in the background")
				require.NoError(t, untilAnswered(t, func() error {
					if rec = post(); rec.Code == http.StatusServiceUnavailable {
						return idem.ErrStoreUnavailable
					}
					return nil
				}))
				require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
				require.Equal(t, "true", rec.Header().Get(idem.ReplayedHeader), "the retry gets the stored answer")
				require.Equal(t, `{"id":"pay_1"}`, rec.Body.String())
				require.Equal(t, 1, runs, "the handler ran once")
			})
		}
	}
}
