package idemlambda_test

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
	"github.com/idemkit/idem/contrib/idemlambda"
)

// Order is the event of the tests' payment function.
type Order struct {
	RequestID string `json:"request_id"`
	Customer  string `json:"customer"`
	Amount    int    `json:"amount"`
	SentAt    string `json:"sent_at,omitempty"` // set by the producer on each delivery
}

// Receipt is what the payment function answers.
type Receipt struct {
	Charge string `json:"charge"`
	Amount int    `json:"amount"`
	Fence  int64  `json:"fence"`
}

func orderKey(_ context.Context, o Order) (string, error) { return o.RequestID, nil }

// charger is the payment function: it charges an order (counted) and
// answers a receipt.
type charger struct {
	charges atomic.Int32
	fail    atomic.Int32  // the next fail runs return an error
	err     error         // what a failing run returns; default a plain error
	started chan struct{} // receives when a run starts, if not nil
	release chan struct{} // a run waits for it to close, if not nil
}

func (c *charger) charge(ctx context.Context, o Order) (Receipt, error) {
	a, ok := idem.AttemptFrom(ctx)
	if !ok {
		return Receipt{}, errors.New("no Attempt in the handler's context")
	}
	if c.started != nil {
		c.started <- struct{}{}
		<-c.release
	}
	if c.fail.Add(-1) >= 0 {
		if c.err != nil {
			return Receipt{}, c.err
		}
		return Receipt{}, errors.New("provider unreachable")
	}
	n := c.charges.Add(1)
	return Receipt{Charge: fmt.Sprintf("ch_%d_%s", n, a.ID), Amount: o.Amount, Fence: a.Fence}, nil
}

func TestSevenDeliveriesTwoInstances(t *testing.T) {
	forEachRedis(t, func(t *testing.T, addr string) {
		c := &charger{started: make(chan struct{}, 1), release: make(chan struct{})}
		a := newInstance(t, addr, idem.WithWait(20*time.Second))
		b := newInstance(t, addr, idem.WithWait(20*time.Second))
		fnA := idemlambda.Handler(a.guard, orderKey, c.charge)
		fnB := idemlambda.Handler(b.guard, orderKey, c.charge)
		order := Order{RequestID: "req-7", Customer: "cus_1", Amount: 1000}

		type answer struct {
			body []byte
			err  error
		}
		answers := make(chan answer, 7)
		deliver := func(fn any, o Order) {
			body, err := invoke(context.Background(), fn, o)
			answers <- answer{body, err}
		}
		go deliver(fnA, order) // the first delivery, on instance A
		<-c.started
		busyA, busyB := a.store.Busy(3), b.store.Busy(3)
		for i := range 6 { // six redeliveries while it runs, three on each instance
			if i%2 == 0 {
				go deliver(fnA, order)
			} else {
				go deliver(fnB, order)
			}
		}
		<-busyA
		<-busyB
		close(c.release)

		var first []byte
		for range 7 {
			ans := <-answers
			require.NoError(t, ans.err)
			if first == nil {
				first = ans.body
			}
			require.JSONEq(t, string(first), string(ans.body), "every delivery answers alike")
		}
		require.Equal(t, int32(1), c.charges.Load(), "one charge")
		require.Equal(t, int64(1), decode[Receipt](t, first).Fence)
	})
}

func TestHandlerRepeatsAndMismatch(t *testing.T) {
	forEachRedis(t, func(t *testing.T, addr string) {
		c := &charger{}
		fn := idemlambda.Handler(newInstance(t, addr).guard, orderKey, c.charge)
		order := Order{RequestID: "req-1", Customer: "cus_1", Amount: 1000}
		first, err := invoke(context.Background(), fn, order)
		require.NoError(t, err)
		again, err := invoke(context.Background(), fn, order)
		require.NoError(t, err)
		require.Equal(t, string(first), string(again))

		other := order
		other.Amount = 2000
		_, err = invoke(context.Background(), fn, other)
		require.ErrorIs(t, err, idem.ErrMismatch)
		other = order
		other.SentAt = "2026-01-01T00:00:00Z" // without WithFingerprint the whole event is compared
		_, err = invoke(context.Background(), fn, other)
		require.ErrorIs(t, err, idem.ErrMismatch)
		require.Equal(t, int32(1), c.charges.Load())
	})
}

func TestHandlerFingerprint(t *testing.T) {
	forEachRedis(t, func(t *testing.T, addr string) {
		c := &charger{}
		fn := idemlambda.Handler(newInstance(t, addr).guard, orderKey, c.charge,
			idemlambda.WithFingerprint(func(o Order) (any, error) { return []any{o.Customer, o.Amount}, nil }))
		order := Order{RequestID: "req-1", Customer: "cus_1", Amount: 1000, SentAt: "2026-01-01T00:00:00Z"}
		first, err := invoke(context.Background(), fn, order)
		require.NoError(t, err)
		order.SentAt = "2026-01-01T00:05:00Z"
		again, err := invoke(context.Background(), fn, order)
		require.NoError(t, err, "a field left out of the fingerprint changed: a repeat")
		require.Equal(t, string(first), string(again))
		order.Amount = 2000
		_, err = invoke(context.Background(), fn, order)
		require.ErrorIs(t, err, idem.ErrMismatch)
		require.Equal(t, int32(1), c.charges.Load())

		broken := idemlambda.Handler(newInstance(t, addr).guard, orderKey, c.charge,
			idemlambda.WithFingerprint(func(Order) (any, error) { return nil, errors.New("no customer") }))
		_, err = invoke(context.Background(), broken, Order{RequestID: "req-2"})
		require.ErrorContains(t, err, "idemlambda: fingerprint: no customer")
		require.Equal(t, int32(1), c.charges.Load())
	})
}

func TestHandlerNoKey(t *testing.T) {
	forEachRedis(t, func(t *testing.T, addr string) {
		c := &charger{}
		in := newInstance(t, addr)
		in.store.Down.Store(true) // the store is never asked
		for name, key := range map[string]func(context.Context, Order) (string, error){
			"empty": orderKey,
			"error": func(context.Context, Order) (string, error) { return "", errors.New("no request id") },
		} {
			_, err := invoke(context.Background(), idemlambda.Handler(in.guard, key, c.charge), Order{Amount: 1})
			require.ErrorIs(t, err, idemlambda.ErrNoKey, name)
			require.NotErrorIs(t, err, idem.ErrStoreUnavailable, name)
		}
		_, err := invoke(context.Background(), idemlambda.Handler(in.guard, func(context.Context, Order) (string, error) {
			return "key\n", nil
		}, c.charge), Order{Amount: 1})
		require.ErrorIs(t, err, idem.ErrInvalidKey)
		require.Zero(t, c.charges.Load())
	})
}

func TestHandlerErrors(t *testing.T) {
	forEachRedis(t, func(t *testing.T, addr string) {
		c := &charger{}
		fn := idemlambda.Handler(newInstance(t, addr).guard, orderKey, c.charge)
		order := Order{RequestID: "req-1", Amount: 1000}
		c.fail.Store(1)
		_, err := invoke(context.Background(), fn, order)
		require.EqualError(t, err, "provider unreachable", "h's own error, as h returned it")
		body, err := invoke(context.Background(), fn, order)
		require.NoError(t, err, "the key was released: Lambda's retry runs again")
		require.Equal(t, int64(2), decode[Receipt](t, body).Fence)

		c.fail.Store(1)
		c.err = idem.Permanent(errors.New("card declined"))
		order.RequestID = "req-2"
		_, first := invoke(context.Background(), fn, order)
		require.ErrorIs(t, first, idem.ErrPermanent)
		_, again := invoke(context.Background(), fn, order)
		require.ErrorIs(t, again, idem.ErrPermanent)
		require.Equal(t, first.Error(), again.Error(), "the stored error, with its message")
		require.Equal(t, int32(1), c.charges.Load())
	})
}

func TestHandlerStoreDownAndBusy(t *testing.T) {
	forEachRedis(t, func(t *testing.T, addr string) {
		c := &charger{started: make(chan struct{}, 1), release: make(chan struct{})}
		in := newInstance(t, addr)
		fn := idemlambda.Handler(in.guard, orderKey, c.charge)
		order := Order{RequestID: "req-1", Amount: 1000}

		in.store.Down.Store(true)
		_, err := invoke(context.Background(), fn, order)
		require.ErrorIs(t, err, idem.ErrStoreUnavailable)
		in.store.Down.Store(false)

		done := make(chan error, 1)
		go func() {
			_, err := invoke(context.Background(), fn, order)
			done <- err
		}()
		select {
		case <-c.started:
		case err := <-done:
			t.Fatalf("the delivery after the store came back was not run: %v", err)
		}
		_, err = invoke(context.Background(), idemlambda.Handler(newInstance(t, addr).guard, orderKey, c.charge), order)
		require.ErrorIs(t, err, idem.ErrInProgress, "without WithWait a concurrent delivery is refused")
		close(c.release)
		require.NoError(t, <-done)
		require.Equal(t, int32(1), c.charges.Load())
	})
}

func TestHandlerScope(t *testing.T) {
	g := newInstance(t, miniredisAddr(t)).guard
	var mu sync.Mutex
	var keys []string
	h := func(ctx context.Context, o Order) (string, error) {
		a, _ := idem.AttemptFrom(ctx)
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, a.Key)
		return a.Key, nil
	}
	order := Order{RequestID: "req-1"}
	for _, fn := range []any{
		idemlambda.Handler(g, orderKey, h, idemlambda.WithScope("billing")),
		idemlambda.Handler(g, orderKey, h, idemlambda.WithScope("shipping")),
		idemlambda.Handler(g, orderKey, h), // outside Lambda: no function name, no scope
	} {
		_, err := invoke(context.Background(), fn, order)
		require.NoError(t, err)
	}
	require.Equal(t, []string{"billing/req-1", "shipping/req-1", "req-1"}, keys, "each scope runs once")
}
