package idemwatermill_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemwatermill"
)

// charger is a handler that charges an order and emits two messages with
// fresh UUIDs; it fails while fail > 0.
type charger struct {
	runs    atomic.Int32
	fail    atomic.Int32
	fences  sync.Map      // run number → Attempt.Fence
	started chan struct{} // receives when a run starts, if not nil
	release chan struct{} // a run waits for it to close, if not nil
}

func (c *charger) handle(msg *message.Message) ([]*message.Message, error) {
	n := c.runs.Add(1)
	if a, ok := idemwatermill.AttemptFrom(msg.Context()); ok {
		c.fences.Store(n, a.Fence)
	}
	if c.started != nil {
		c.started <- struct{}{}
		<-c.release
	}
	if c.fail.Add(-1) >= 0 {
		return nil, errors.New("provider unreachable")
	}
	charged := message.NewMessage(watermill.NewUUID(), []byte("charged "+string(msg.Payload)))
	charged.Metadata.Set("order", string(msg.Payload))
	receipt := message.NewMessage(watermill.NewUUID(), []byte("receipt for "+string(msg.Payload)))
	return []*message.Message{charged, receipt}, nil
}

func fence(c *charger, run int32) int64 {
	f, _ := c.fences.Load(run)
	v, _ := f.(int64)
	return v
}

// brief is what a test compares of a message.
func brief(msgs []*message.Message) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, fmt.Sprintf("%s %s %v", m.UUID, m.Payload, m.Metadata))
	}
	return out
}

func TestRedeliveryReplaysOutputs(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		c := &charger{}
		h := idemwatermill.Middleware(b.Guard())(c.handle)
		msg := message.NewMessage("msg-1", []byte("order 42"))
		first, err := h(msg.Copy())
		require.NoError(t, err)
		require.Len(t, first, 2)
		for range 2 {
			again, err := h(msg.Copy())
			require.NoError(t, err)
			require.Equal(t, brief(first), brief(again), "the same outputs, same UUIDs")
		}
		require.Equal(t, int32(1), c.runs.Load())
		require.Equal(t, int64(1), fence(c, 1))
	})
}

func TestHandlerErrorReleases(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		c := &charger{}
		c.fail.Store(1)
		h := idemwatermill.Middleware(b.Guard())(c.handle)
		msg := message.NewMessage("msg-1", []byte("order 42"))
		_, err := h(msg.Copy())
		require.EqualError(t, err, "provider unreachable", "the handler's own error")
		out, err := h(msg.Copy())
		require.NoError(t, err)
		require.Len(t, out, 2)
		require.Equal(t, int32(2), c.runs.Load())
		require.Equal(t, int64(2), fence(c, 2), "the redelivery knows an earlier attempt started")
	})
}

func TestPanicReleases(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		runs := 0
		h := idemwatermill.Middleware(b.Guard())(func(msg *message.Message) ([]*message.Message, error) {
			if runs++; runs == 1 {
				panic("boom")
			}
			return nil, nil
		})
		msg := message.NewMessage("msg-1", []byte("order 42"))
		require.PanicsWithValue(t, "boom", func() { _, _ = h(msg.Copy()) })
		out, err := h(msg.Copy())
		require.NoError(t, err)
		require.Empty(t, out)
		_, err = h(msg.Copy())
		require.NoError(t, err)
		require.Equal(t, 2, runs)
	})
}

func TestRefusals(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		c := &charger{}
		g := b.Guard()
		h := idemwatermill.Middleware(g)(c.handle)

		_, err := h(message.NewMessage("", []byte("order 42")))
		require.ErrorIs(t, err, idemwatermill.ErrNoKey)

		_, err = idemwatermill.Middleware(g, idemwatermill.WithKeyMetadata("order_id"))(c.handle)(message.NewMessage("msg-1", []byte("order 42")))
		require.ErrorIs(t, err, idemwatermill.ErrNoKey)
		require.ErrorContains(t, err, `"order_id"`)

		_, err = h(message.NewMessage("bad\nkey", []byte("order 42")))
		require.ErrorIs(t, err, idem.ErrInvalidKey)

		b.Store.Down.Store(true)
		_, err = h(message.NewMessage("msg-2", []byte("order 42")))
		require.ErrorIs(t, err, idem.ErrStoreUnavailable)
		b.Store.Down.Store(false)

		_, err = h(message.NewMessage("msg-3", []byte("order 42")))
		require.NoError(t, err)
		_, err = h(message.NewMessage("msg-3", []byte("order 43")))
		require.ErrorIs(t, err, idem.ErrMismatch, "another payload is not a redelivery")
		require.ErrorContains(t, err, "msg-3")

		require.Equal(t, int32(1), c.runs.Load(), "only msg-3's first delivery ran")
	})
}

// TestKeyMetadata: with WithKeyMetadata, a message re-sent with a new UUID
// but the same business id is a redelivery.
func TestKeyMetadata(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		c := &charger{}
		h := idemwatermill.Middleware(b.Guard(), idemwatermill.WithKeyMetadata("order_id"))(c.handle)
		var outs [][]string
		for _, uuid := range []string{"msg-1", "msg-2"} {
			msg := message.NewMessage(uuid, []byte("order 42"))
			msg.Metadata.Set("order_id", "42")
			out, err := h(msg)
			require.NoError(t, err)
			outs = append(outs, brief(out))
		}
		require.Equal(t, outs[0], outs[1])
		require.Equal(t, int32(1), c.runs.Load())
	})
}

// TestConcurrentRedeliveries: 32 deliveries of one message at once run the
// handler once. With the Guard's WithWait every one returns the same
// outputs; without it the others fail with ErrInProgress, to be nacked.
func TestConcurrentRedeliveries(t *testing.T) {
	for _, wait := range []bool{true, false} {
		t.Run(fmt.Sprint("wait=", wait), func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b *backend) {
				var opts []idem.Option
				if wait {
					opts = append(opts, idem.WithWait(10*time.Second))
				}
				c := &charger{started: make(chan struct{}, 32), release: make(chan struct{})}
				h := idemwatermill.Middleware(b.Guard(opts...))(c.handle)
				msg := message.NewMessage("msg-1", []byte("order 42"))
				type result struct {
					out []string
					err error
				}
				results := make(chan result, 32)
				waiting := b.Store.Busy(31)
				var wg sync.WaitGroup
				for range 32 {
					wg.Go(func() {
						out, err := h(msg.Copy())
						results <- result{brief(out), err}
					})
				}
				<-c.started
				if wait {
					<-waiting // every duplicate was told to wait
				} else {
					for range 31 { // every duplicate has its answer before the first ends
						r := <-results
						require.ErrorIs(t, r.err, idem.ErrInProgress)
						var ip *idem.InProgressError
						require.ErrorAs(t, r.err, &ip)
						require.Positive(t, ip.RetryAfter)
					}
				}
				close(c.release)
				wg.Wait()
				close(results)
				var outs [][]string
				for r := range results {
					require.NoError(t, r.err)
					outs = append(outs, r.out)
				}
				require.Len(t, outs, map[bool]int{true: 32, false: 1}[wait])
				for _, out := range outs {
					require.Equal(t, outs[0], out)
				}
				require.Equal(t, int32(1), c.runs.Load())
			})
		})
	}
}

// flakyPublisher fails the first publishes it is told to, and records the
// UUIDs of every publish it was asked for.
type flakyPublisher struct {
	message.Publisher
	mu       sync.Mutex
	fail     int
	attempts [][]string
}

func (p *flakyPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.Lock()
	var ids []string
	for _, m := range msgs {
		ids = append(ids, m.UUID)
	}
	p.attempts = append(p.attempts, ids)
	fail := p.fail > 0
	p.fail--
	p.mu.Unlock()
	if fail {
		return errors.New("broker unavailable")
	}
	return p.Publisher.Publish(topic, msgs...)
}

// TestRouter: a router whose publishes of the outputs fail twice. The broker
// redelivers the message, the middleware re-emits the same outputs, and the
// handler runs once; a second handler on the same topic (fan-out) has its
// own key and runs once too.
func TestRouter(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		logger := watermill.NopLogger{}
		pubsub := gochannel.NewGoChannel(gochannel.Config{}, logger)
		defer pubsub.Close()
		received, err := pubsub.Subscribe(context.Background(), "charged")
		require.NoError(t, err)

		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: time.Second}, logger)
		require.NoError(t, err)
		router.AddMiddleware(idemwatermill.Middleware(b.Guard()))
		c := &charger{}
		out := &flakyPublisher{Publisher: pubsub, fail: 2}
		router.AddHandler("charge", "payments", pubsub, "charged", out, c.handle)
		var audits atomic.Int32
		router.AddConsumerHandler("audit", "payments", pubsub, func(msg *message.Message) error {
			a, ok := idemwatermill.AttemptFrom(msg.Context())
			if !ok || a.Key != "audit/"+msg.UUID {
				return fmt.Errorf("attempt %+v", a)
			}
			audits.Add(1)
			return nil
		})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { _ = router.Run(ctx) }()
		defer router.Close()
		<-router.Running()

		require.NoError(t, pubsub.Publish("payments", message.NewMessage("msg-1", []byte("order 42"))))
		var got []string
		for range 2 {
			select {
			case m := <-received:
				got = append(got, m.UUID)
				m.Ack()
			case <-time.After(5 * time.Second):
				t.Fatal("outputs not published")
			}
		}
		require.Eventually(t, func() bool { return audits.Load() == 1 }, 5*time.Second, 5*time.Millisecond)
		require.Equal(t, int32(1), c.runs.Load())

		out.mu.Lock()
		defer out.mu.Unlock()
		require.Len(t, out.attempts, 3)
		for _, ids := range out.attempts {
			require.ElementsMatch(t, got, ids, "every publish carries the same UUIDs (gochannel delivers in any order)")
			require.Equal(t, out.attempts[0], ids)
		}
	})
}
