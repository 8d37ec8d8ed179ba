package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// outMsg is a message a consumer publishes.
type outMsg struct {
	ID   string `json:"id"`
	Body string `json:"body"`
}

// flakyBroker accepts published messages, failing the first ones it is told
// to, and counts deliveries per message id.
type flakyBroker struct {
	mu        sync.Mutex
	failFirst int
	got       map[string]int
	order     []string
}

func (b *flakyBroker) publish(m outMsg) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failFirst > 0 {
		b.failFirst--
		return errors.New("broker unavailable")
	}
	if b.got == nil {
		b.got = map[string]int{}
	}
	b.got[m.ID]++
	b.order = append(b.order, m.ID)
	return nil
}

// handle is a consumer whose effect publishes output messages: Do, keyed by
// the incoming message id, runs the effect once and stores the outputs; the
// outputs are published after Do, so a redelivery (after a failed publish,
// or of an already acknowledged message) publishes the same outputs again,
// with the same ids, without running the effect again. Downstream consumers
// deduplicate by those ids.
func handle(ctx context.Context, g *idem.Guard, b *flakyBroker, effects *atomic.Int32, id, body string) error {
	outs, err := idem.Do(ctx, g, id, body, func(ctx context.Context, a *idem.Attempt) ([]outMsg, error) {
		effects.Add(1)
		return []outMsg{
			{ID: a.ID + "-1", Body: "charged " + body},
			{ID: a.ID + "-2", Body: "receipt for " + body},
		}, nil
	})
	if err != nil {
		return err // not acknowledged: the broker redelivers
	}
	for _, m := range outs {
		if err := b.publish(m); err != nil {
			return err // not acknowledged: the redelivery republishes
		}
	}
	return nil
}

// TestConsumerRepublishesOutputs: the publish fails after the effect; the
// redeliveries republish the same output messages (same ids) and the
// effect runs once. Once alone would mark the message done and lose the
// outputs, or run the effect again.
func TestConsumerRepublishesOutputs(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t)
		ctx := context.Background()
		broker := &flakyBroker{failFirst: 3}
		var effects atomic.Int32
		deliveries := 0
		for {
			deliveries++
			if handle(ctx, g, broker, &effects, "msg-1", "order 42") == nil {
				break
			}
			require.Less(t, deliveries, 10)
		}
		require.Equal(t, int32(1), effects.Load())
		require.Equal(t, 4, deliveries, "three failed publishes, then one that went through")
		require.Len(t, broker.got, 2)

		// A redelivery of the acknowledged message republishes the same
		// ids; a downstream deduplicating by id sees each once.
		require.NoError(t, handle(ctx, g, broker, &effects, "msg-1", "order 42"))
		require.Equal(t, int32(1), effects.Load())
		require.Len(t, broker.got, 2)
		for id, n := range broker.got {
			require.Equal(t, 2, n, "message %s published once per successful delivery", id)
		}
	})
}

// TestConsumerConcurrentRedeliveries: 16 concurrent redeliveries of each of
// 8 messages, with publishes failing at random: each effect runs once, and
// every output id is the same across its publishes.
func TestConsumerConcurrentRedeliveries(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t, idem.WithWait(5e9))
		ctx := context.Background()
		broker := &flakyBroker{failFirst: 20}
		var effects atomic.Int32
		var wg sync.WaitGroup
		errs := make(chan error, 8*16)
		for m := range 8 {
			for range 16 {
				wg.Go(func() {
					id := fmt.Sprint("msg-", m)
					for range 40 { // redeliver until acknowledged
						if handle(ctx, g, broker, &effects, id, id) == nil {
							return
						}
					}
					errs <- fmt.Errorf("%s never acknowledged", id)
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.Equal(t, int32(8), effects.Load(), "one effect per message")
		require.Len(t, broker.got, 16, "two stable output ids per message")
	})
}
