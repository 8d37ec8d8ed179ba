package idemtest_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idemtest"
)

// A unit test of a function run by idem.Do: a Guard in one call, no Redis.
func ExampleNewGuard() {
	ctx := context.Background()
	g := idemtest.NewGuard()
	charges := 0
	charge := func(ctx context.Context, a *idem.Attempt) (string, error) {
		charges++
		return "receipt " + a.Key, nil
	}
	for range 3 {
		receipt, err := idem.Do(ctx, g, "order-42", map[string]int{"amount": 1000}, charge)
		fmt.Println(receipt, err)
	}
	fmt.Println("charges:", charges)
	// Output:
	// receipt order-42 <nil>
	// receipt order-42 <nil>
	// receipt order-42 <nil>
	// charges: 1
}

// The reconciliation branch: run the function as attempt 2, after an
// attempt that charged and died before completing.
func ExampleNewAttemptGuard() {
	ctx := context.Background()
	provider := map[string]string{"ch_1": "charged"} // the provider's side: the dead attempt's charge
	charge := func(ctx context.Context, a *idem.Attempt) (string, error) {
		if id := a.Checkpoints()["charge_id"]; a.Fence > 1 && id != nil {
			if status, ok := provider[string(id)]; ok {
				return "reconciled " + string(id) + " (" + status + ")", nil // no second charge
			}
		}
		provider["ch_2"] = "charged"
		if err := a.Checkpoint(ctx, "charge_id", []byte("ch_2")); err != nil {
			return "", err
		}
		return "charged ch_2", nil
	}

	g := idemtest.NewAttemptGuard(2, map[string][]byte{"charge_id": []byte("ch_1")})
	fmt.Println(idem.Do(ctx, g, "order-42", "req", charge))
	fmt.Println("provider charges:", len(provider))
	// Output:
	// reconciled ch_1 (charged) <nil>
	// provider charges: 1
}

// A handler under the middleware, run as attempt 3. The handler checks ok:
// called directly, outside the middleware, it has no Attempt.
func ExampleAsAttempt() {
	store := idemtest.NewMemoryStore()
	g := idem.New(idemtest.AsAttempt(store, 3, nil))
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, ok := idem.AttemptFrom(r.Context())
		if !ok {
			http.Error(w, "no idempotency attempt", http.StatusInternalServerError)
			return
		}
		if a.Fence > 1 {
			fmt.Fprintf(w, "attempt %d: looking up the earlier attempts first", a.Fence)
			return
		}
		fmt.Fprint(w, "first attempt")
	})

	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":1000}`))
	r.Header.Set("Idempotency-Key", "k1")
	w := httptest.NewRecorder()
	g.Middleware()(handler).ServeHTTP(w, r)
	fmt.Println(w.Code, w.Body)

	w = httptest.NewRecorder()
	handler.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/payments", nil))
	fmt.Println(w.Code, strings.TrimSpace(w.Body.String()))
	// Output:
	// 200 attempt 3: looking up the earlier attempts first
	// 500 no idempotency attempt
}

// The design's test: the same request 16 times at once, one execution.
func ExampleParallel() {
	g := idemtest.NewGuard(idem.WithWait(5 * time.Second))
	payments := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(20 * time.Millisecond) // the side effect
		w.WriteHeader(http.StatusCreated)
	})
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":1000}`))
	r.Header.Set("Idempotency-Key", idemclient.NewKey())

	res := idemtest.Parallel(16, r, g.Middleware(), payments)
	fmt.Println("handler ran:", res.Ran)
	fmt.Println("statuses:", res.Statuses)
	fmt.Println("replayed:", res.Replayed)
	// Output:
	// handler ran: 1
	// statuses: map[201:16]
	// replayed: 15
}

// Leases and retention without sleeping: the store's clock moves on demand.
func ExampleMemoryStore_Advance() {
	ctx := context.Background()
	store := idemtest.NewMemoryStore()
	g := idem.New(store, idem.WithRetention(time.Hour))
	run := func(ctx context.Context, a *idem.Attempt) (int64, error) { return a.Fence, nil }

	_, _ = idem.Do(ctx, g, "k", "req", run)
	rec, _ := store.Read(ctx, idem.OperationID(idem.KindDo, "", "k"))
	fmt.Println(rec.State, rec.Fence)

	store.Advance(time.Hour) // the retention passes: the key is new again
	rec, _ = store.Read(ctx, idem.OperationID(idem.KindDo, "", "k"))
	fmt.Println(rec == nil)
	// Output:
	// COMPLETED 1
	// true
}

// The same tests on the Redis store, over an embedded Redis (miniredis, a
// test dependency of yours): the real scripts, no server to run.
func Example_miniredis() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := idem.New(idem.NewRedisStore(rdb))

	_, err = idem.Do(context.Background(), g, "k", "req", func(ctx context.Context, a *idem.Attempt) (string, error) {
		return "", errors.New("provider down") // released: the retry runs again
	})
	fmt.Println(err)
	fence, err := idem.Do(context.Background(), g, "k", "req", func(ctx context.Context, a *idem.Attempt) (int64, error) {
		return a.Fence, nil
	})
	fmt.Println("retry as attempt", fence, err)
	// Output:
	// provider down
	// retry as attempt 2 <nil>
}
