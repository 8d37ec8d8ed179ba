package idemsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsql"
)

// TestTxOnce: the first call commits the effect and its outcome; repeats
// are answered by Redis and never reach the database.
func TestTxOnce(t *testing.T) {
	forEachDB(t, func(t *testing.T, d database) {
		g, _ := miniGuard(t)
		p := &payer{name: "once"}
		txCalls := 0
		fn := func(ctx context.Context, a *idem.Attempt) (string, error) {
			txCalls++
			return idemsql.Tx(ctx, d.db, a, p.pay)
		}
		for range 3 {
			v, err := idem.Do(context.Background(), g, "key-once", payReq{Amount: 100}, fn)
			require.NoError(t, err)
			require.Equal(t, "receipt-once-1", v)
		}
		require.Equal(t, 1, txCalls, "repeats are replayed by Redis")
		require.Equal(t, 1, count(t, d.db, "payments"))
		require.Equal(t, []outcome{{Key: "key-once", Fence: 1, Result: "receipt-once-1"}}, readOutcomes(t, d.db))
	})
}

// TestTxFnError: an error from fn rolls back the effect and the outcome;
// the next attempt runs again and commits.
func TestTxFnError(t *testing.T) {
	forEachDB(t, func(t *testing.T, d database) {
		g, _ := miniGuard(t)
		p := &payer{name: "err"}
		boom := errors.New("provider declined")
		_, err := idem.Do(context.Background(), g, "key-err", payReq{Amount: 1}, func(ctx context.Context, a *idem.Attempt) (string, error) {
			return idemsql.Tx(ctx, d.db, a, func(ctx context.Context, tx *sql.Tx) (string, error) {
				if _, err := p.pay(ctx, tx); err != nil {
					return "", err
				}
				return "", fmt.Errorf("charge: %w", boom)
			})
		})
		require.ErrorIs(t, err, boom, "fn's error, unchanged")
		require.Equal(t, 0, count(t, d.db, "payments"), "the effect is rolled back")
		require.Equal(t, 0, count(t, d.db, "idem_outcomes"), "no outcome for a failed attempt")

		v, err := idem.Do(context.Background(), g, "key-err", payReq{Amount: 1}, func(ctx context.Context, a *idem.Attempt) (string, error) {
			require.Equal(t, int64(2), a.Fence)
			return idemsql.Tx(ctx, d.db, a, p.pay)
		})
		require.NoError(t, err)
		require.Equal(t, "receipt-err-2", v)
		require.Equal(t, 1, count(t, d.db, "payments"))
		require.Equal(t, []outcome{{Key: "key-err", Fence: 2, Result: "receipt-err-2"}}, readOutcomes(t, d.db))
	})
}

// TestTxPermanentError: a Permanent error is stored by Do in Redis only;
// the database keeps nothing of the attempt.
func TestTxPermanentError(t *testing.T) {
	forEachDB(t, func(t *testing.T, d database) {
		g, _ := miniGuard(t)
		p := &payer{name: "perm"}
		_, err := idem.Do(context.Background(), g, "key-perm", payReq{}, func(ctx context.Context, a *idem.Attempt) (string, error) {
			return idemsql.Tx(ctx, d.db, a, func(ctx context.Context, tx *sql.Tx) (string, error) {
				_, _ = p.pay(ctx, tx)
				return "", idem.Permanent(errors.New("card declined"))
			})
		})
		require.ErrorIs(t, err, idem.ErrPermanent)
		require.Equal(t, 0, count(t, d.db, "payments"))
		require.Equal(t, 0, count(t, d.db, "idem_outcomes"))
	})
}

// TestTxPanic: a panic in fn rolls back and continues; the connection goes
// back to the pool.
func TestTxPanic(t *testing.T) {
	forEachDB(t, func(t *testing.T, d database) {
		g, _ := miniGuard(t)
		p := &payer{name: "panic"}
		require.PanicsWithValue(t, "boom", func() {
			_, _ = idem.Do(context.Background(), g, "key-panic", payReq{}, func(ctx context.Context, a *idem.Attempt) (string, error) {
				return idemsql.Tx(ctx, d.db, a, func(ctx context.Context, tx *sql.Tx) (string, error) {
					_, _ = p.pay(ctx, tx)
					panic("boom")
				})
			})
		})
		require.Equal(t, 0, count(t, d.db, "payments"))
		require.Equal(t, 0, count(t, d.db, "idem_outcomes"))
		require.Zero(t, d.db.Stats().InUse, "the transaction's connection is released")
	})
}

// TestTxCancelled: an attempt whose context ends while fn runs (its lease
// was lost) cannot commit.
func TestTxCancelled(t *testing.T) {
	forEachDB(t, func(t *testing.T, d database) {
		ctx, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		p := &payer{name: "cancel"}
		a := &idem.Attempt{Key: "key-cancel", ID: "id-cancel", Fence: 1}
		_, err := idemsql.Tx(ctx, d.db, a, func(ctx context.Context, tx *sql.Tx) (string, error) {
			v, err := p.pay(ctx, tx)
			cancel(idem.ErrLeaseLost)
			return v, err
		})
		require.Error(t, err)
		require.True(t, strings.HasPrefix(err.Error(), "idem: "), err.Error())
		require.Equal(t, 0, count(t, d.db, "payments"))
		require.Equal(t, 0, count(t, d.db, "idem_outcomes"))
	})
}

type receipt struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// TestTxResults: results are stored as idem.Do stores them (a string or
// []byte as is, anything else as JSON) and decode back after Redis forgot.
func TestTxResults(t *testing.T) {
	forEachDB(t, func(t *testing.T, d database) {
		g, mr := miniGuard(t)
		check := func(t *testing.T, key string, stored string, run func(key string) (any, error)) {
			t.Helper()
			first, err := run(key)
			require.NoError(t, err)
			mr.FlushAll() // Redis forgets: the next answer comes from the database
			again, err := run(key)
			require.NoError(t, err)
			require.Equal(t, first, again)
			var b []byte
			require.NoError(t, d.db.QueryRow(`SELECT result FROM idem_outcomes WHERE key = $1`, key).Scan(&b))
			require.Equal(t, stored, string(b))
		}
		check(t, "k-string", "a receipt", func(key string) (any, error) {
			return do(g, d.db, key, "a receipt")
		})
		check(t, "k-empty-string", "", func(key string) (any, error) { return do(g, d.db, key, "") })
		check(t, "k-bytes", "\x00\xffraw", func(key string) (any, error) { return do(g, d.db, key, []byte("\x00\xffraw")) })
		check(t, "k-struct", `{"id":"r1","amount":5}`, func(key string) (any, error) {
			return do(g, d.db, key, receipt{ID: "r1", Amount: 5})
		})
		check(t, "k-pointer", `{"id":"r2","amount":6}`, func(key string) (any, error) {
			return do(g, d.db, key, &receipt{ID: "r2", Amount: 6})
		})
	})
}

// do runs Do with a Tx whose result is v the first time and a different
// value on any later run, so that a second run would show.
func do[T any](g *idem.Guard, db *sql.DB, key string, v T) (T, error) {
	runs := 0
	return idem.Do(context.Background(), g, key, payReq{}, func(ctx context.Context, a *idem.Attempt) (T, error) {
		return idemsql.Tx(ctx, db, a, func(ctx context.Context, tx *sql.Tx) (T, error) {
			runs++
			if runs > 1 {
				var zero T
				return zero, errors.New("ran twice")
			}
			return v, nil
		})
	})
}

// TestTxUnencodableResult: a result that JSON cannot encode is an error
// and nothing commits.
func TestTxUnencodableResult(t *testing.T) {
	forEachDB(t, func(t *testing.T, d database) {
		a := &idem.Attempt{Key: "k", ID: "id-chan", Fence: 1}
		p := &payer{name: "chan"}
		_, err := idemsql.Tx(context.Background(), d.db, a, func(ctx context.Context, tx *sql.Tx) (chan int, error) {
			_, err := p.pay(ctx, tx)
			return make(chan int), err
		})
		require.ErrorContains(t, err, "idem: result of type chan int is not JSON-encodable")
		require.Equal(t, 0, count(t, d.db, "payments"))
		require.Equal(t, 0, count(t, d.db, "idem_outcomes"))
	})
}

// TestTxCommittedResultOfAnotherType: a committed result that does not
// decode into T is a clear error, not a second run.
func TestTxCommittedResultOfAnotherType(t *testing.T) {
	d := openSQLite(t)
	a := &idem.Attempt{Key: "k", ID: "id-type", Fence: 1}
	_, err := idemsql.Tx(context.Background(), d.db, a, func(context.Context, *sql.Tx) (string, error) { return "text", nil })
	require.NoError(t, err)
	a.Fence = 2
	_, err = idemsql.Tx(context.Background(), d.db, a, func(context.Context, *sql.Tx) (int, error) {
		t.Error("ran again")
		return 0, nil
	})
	require.ErrorContains(t, err, "idem: committed outcome of operation id-type (fence 1): result does not decode into int")
}

func TestTxArguments(t *testing.T) {
	d := openSQLite(t)
	a := &idem.Attempt{Key: "k", ID: "id", Fence: 1}
	fn := func(context.Context, *sql.Tx) (int, error) { return 1, nil }
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		run  func() error
		want string
	}{
		{name: "nil db", run: func() error { _, err := idemsql.Tx(ctx, nil, a, fn); return err }, want: "idem: Tx with a nil *sql.DB"},
		{name: "nil attempt", run: func() error { _, err := idemsql.Tx(ctx, d.db, nil, fn); return err }, want: "idem: Tx without the operation's Attempt"},
		{name: "attempt without id", run: func() error { _, err := idemsql.Tx(ctx, d.db, &idem.Attempt{Key: "k"}, fn); return err }, want: "idem: Tx without the operation's Attempt"},
		{name: "nil fn", run: func() error { _, err := idemsql.Tx[int](ctx, d.db, a, nil); return err }, want: "idem: Tx with a nil function"},
		{name: "CreateTable nil db", run: func() error { return idemsql.CreateTable(ctx, nil) }, want: "idem: CreateTable with a nil *sql.DB"},
		{name: "Sweep nil db", run: func() error { _, err := idemsql.Sweep(ctx, nil, time.Hour); return err }, want: "idem: Sweep with a nil *sql.DB"},
		{name: "Sweep below a second", run: func() error { _, err := idemsql.Sweep(ctx, d.db, time.Millisecond); return err }, want: "idem: Sweep olderThan 1ms: must be at least a second"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			require.ErrorContains(t, tt.run(), tt.want)
		})
	}
	require.Equal(t, 0, count(t, d.db, "idem_outcomes"))
}

// TestMiddleware: a handler under Guard.Middleware finds its attempt with
// AttemptFrom and commits through Tx; after Redis forgot, the repeat gets
// the committed payment without a second row.
func TestMiddleware(t *testing.T) {
	forEachDB(t, func(t *testing.T, d database) {
		g, mr := miniGuard(t)
		p := &payer{name: "http"}
		handlerRuns := 0
		h := g.Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			handlerRuns++
			a, _ := idem.AttemptFrom(r.Context())
			v, err := idemsql.Tx(r.Context(), d.db, a, p.pay)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, v)
		}))
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		post := func() (int, string, string) {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":100}`))
			req.Header.Set("Idempotency-Key", "key-http")
			resp, err := srv.Client().Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b), resp.Header.Get(idem.ReplayedHeader)
		}
		code, body, replayed := post()
		require.Equal(t, http.StatusCreated, code)
		require.Equal(t, "receipt-http-1", body)
		require.Empty(t, replayed)
		_, body, replayed = post()
		require.Equal(t, "receipt-http-1", body)
		require.Equal(t, "true", replayed, "Redis answers the repeat")

		mr.FlushAll()
		code, body, _ = post()
		require.Equal(t, http.StatusCreated, code)
		require.Equal(t, "receipt-http-1", body, "the database answers once Redis forgot")
		require.Equal(t, 2, handlerRuns)
		require.Equal(t, 1, count(t, d.db, "payments"))
	})
}
