package idem_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// newExampleGuard starts an embedded Redis (miniredis) for the examples; in
// production, pass a client of your Redis or Redis Cluster.
func newExampleGuard() (*idem.Guard, func()) {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	return idem.New(idem.NewRedisStore(rdb)), func() { rdb.Close(); m.Close() }
}

func ExampleDo() {
	g, stop := newExampleGuard()
	defer stop()
	ctx := context.Background()

	type Payment struct {
		Amount   int
		Currency string
	}
	charges := 0
	pay := func(ctx context.Context, a *idem.Attempt) (string, error) {
		// a.ID is stable across retries: hand it to the provider as its
		// idempotency key too.
		charges++
		return "receipt-" + a.ID[:8], nil
	}

	key := "5f0c6d1e-8a2b-4c47-9a3e-2f1d8b7c6a50" // from the client's Idempotency-Key
	first, err := idem.Do(ctx, g, key, Payment{1000, "EUR"}, pay)
	if err != nil {
		fmt.Println(err)
		return
	}
	retry, _ := idem.Do(ctx, g, key, Payment{1000, "EUR"}, pay) // the answer was lost; the app retries
	fmt.Println(first == retry, "charges:", charges)

	_, err = idem.Do(ctx, g, key, Payment{5000, "EUR"}, pay) // same key, another request
	fmt.Println(errors.Is(err, idem.ErrMismatch))
	// Output:
	// true charges: 1
	// true
}

func ExampleGuard_Once() {
	g, stop := newExampleGuard()
	defer stop()
	ctx := context.Background()

	handle := func(ctx context.Context) error {
		fmt.Println("sending the welcome email")
		return nil
	}
	for _, delivery := range []string{"msg-42", "msg-42"} { // at-least-once delivery
		ran, err := g.Once(ctx, delivery, handle)
		fmt.Println("ran:", ran, "err:", err)
	}
	// Output:
	// sending the welcome email
	// ran: true err: <nil>
	// ran: false err: <nil>
}

func ExamplePermanent() {
	g, stop := newExampleGuard()
	defer stop()
	ctx := context.Background()

	charge := func(ctx context.Context, a *idem.Attempt) (string, error) {
		// A declined card is the operation's answer: keep it, do not retry.
		return "", idem.Permanent(errors.New("card declined"))
	}
	for range 2 {
		_, err := idem.Do(ctx, g, "order-7", nil, charge)
		fmt.Println(err, errors.Is(err, idem.ErrPermanent))
	}
	// Output:
	// card declined true
	// card declined true
}

func ExampleAttempt_Checkpoint() {
	g, stop := newExampleGuard()
	defer stop()
	ctx := context.Background()

	charge := func(ctx context.Context, a *idem.Attempt) (string, error) {
		if id, ok := a.Checkpoints()["charge"]; ok && a.Fence > 1 {
			// An earlier attempt charged and died before completing.
			return string(id), nil
		}
		id := "ch_123" // the provider's charge, made with a.ID as its idempotency key
		if err := a.Checkpoint(ctx, "charge", []byte(id)); err != nil {
			return "", err
		}
		return id, nil
	}
	v, err := idem.Do(ctx, g, "order-8", nil, charge)
	fmt.Println(v, err)
	// Output:
	// ch_123 <nil>
}

// A consumer whose effect publishes messages: Do, keyed by the incoming
// message id, runs the effect once and stores the outputs, which are
// published after it. A redelivery (the publish failed, or the broker
// redelivered an acknowledged message) publishes the same outputs, with the
// same ids, without running the effect again; downstream consumers
// deduplicate by id. Once alone would mark the message done after the effect
// and lose outputs whose publish failed.
func ExampleDo_consumerThatPublishes() {
	g, stop := newExampleGuard()
	defer stop()
	ctx := context.Background()

	type Out struct{ ID, Body string }
	failures := 1
	publish := func(m Out) error {
		if failures > 0 {
			failures--
			return errors.New("broker unavailable")
		}
		fmt.Println("published", m.Body)
		return nil
	}
	consume := func(msgID, order string) error {
		outs, err := idem.Do(ctx, g, msgID, order, func(ctx context.Context, a *idem.Attempt) ([]Out, error) {
			fmt.Println("charging", order) // the effect
			return []Out{{ID: a.ID + "-charged", Body: "charged " + order}}, nil
		})
		if err != nil {
			return err // not acknowledged: redelivered
		}
		for _, m := range outs {
			if err := publish(m); err != nil {
				return err // not acknowledged: the redelivery publishes the same message
			}
		}
		return nil // acknowledged
	}
	for consume("msg-7", "order 42") != nil {
		fmt.Println("redelivered")
	}
	// Output:
	// charging order 42
	// redelivered
	// published charged order 42
}
