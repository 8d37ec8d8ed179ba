package idemwatermill_test

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemwatermill"
)

func ExampleMiddleware() {
	mr := miniredis.NewMiniRedis() // an embedded Redis for the example; use yours in production
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := idem.New(idem.NewRedisStore(rdb))

	charge := func(msg *message.Message) ([]*message.Message, error) {
		fmt.Println("charging", string(msg.Payload)) // the side effect
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("charged "+string(msg.Payload)))}, nil
	}
	// In a router: router.AddMiddleware(idemwatermill.Middleware(g)).
	handler := idemwatermill.Middleware(g)(charge)

	msg := message.NewMessage("msg-7", []byte("order 42"))
	first, _ := handler(msg.Copy())
	again, _ := handler(msg.Copy()) // the broker redelivers it: the publish of the output failed
	fmt.Println(string(again[0].Payload), "same UUID:", again[0].UUID == first[0].UUID)

	_, err := handler(message.NewMessage("msg-7", []byte("order 43")))
	fmt.Println("another payload:", errors.Is(err, idem.ErrMismatch))
	_, err = handler(message.NewMessage("", []byte("order 44")))
	fmt.Println("no UUID:", errors.Is(err, idemwatermill.ErrNoKey))
	// Output:
	// charging order 42
	// charged order 42 same UUID: true
	// another payload: true
	// no UUID: true
}

// Events relayed from a webhook get a new UUID on every delivery; their id
// is in the payload, and their attempt count changes.
func ExampleWithKeyFunc() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := idem.New(idem.NewRedisStore(rdb))

	id, fp := idem.KeyFromJSON("/id"), idem.FingerprintJSON("/type", "/data")
	handler := idemwatermill.Middleware(g,
		idemwatermill.WithKeyFunc(func(m *message.Message) (string, error) { return id(nil, m.Payload) }),
		idemwatermill.WithFingerprint(func(m *message.Message) ([]byte, error) { return fp(nil, m.Payload) }),
	)(func(msg *message.Message) ([]*message.Message, error) {
		fmt.Println("handling", string(msg.Payload))
		return nil, nil
	})

	_, err := handler(message.NewMessage(watermill.NewUUID(), []byte(`{"id":"evt_1","type":"invoice.paid","attempt":1,"data":{"amount":1000}}`)))
	fmt.Println(err)
	_, err = handler(message.NewMessage(watermill.NewUUID(), []byte(`{"id":"evt_1","type":"invoice.paid","attempt":2,"data":{"amount":1000}}`)))
	fmt.Println(err)
	// Output:
	// handling {"id":"evt_1","type":"invoice.paid","attempt":1,"data":{"amount":1000}}
	// <nil>
	// <nil>
}
