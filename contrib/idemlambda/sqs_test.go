package idemlambda_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemlambda"
)

// shipper is an SQS consumer that records what it handled, and fails the
// bodies in fail (a Permanent error for those in permanent).
type shipper struct {
	mu        sync.Mutex
	handled   []string // body#fence, in order
	fail      map[string]int
	permanent map[string]bool
	started   chan struct{} // receives when a run of "slow" starts, if not nil
	release   chan struct{}
}

func (s *shipper) ship(ctx context.Context, m events.SQSMessage) error {
	a, ok := idem.AttemptFrom(ctx)
	if !ok {
		return errors.New("no Attempt in the record's context")
	}
	if m.Body == "slow" && s.started != nil {
		s.started <- struct{}{}
		<-s.release
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handled = append(s.handled, m.Body+"#"+strconv.FormatInt(a.Fence, 10))
	switch {
	case s.permanent[m.Body]:
		return idem.Permanent(errors.New("malformed order"))
	case s.fail[m.Body] > 0:
		s.fail[m.Body]--
		return errors.New("warehouse unreachable")
	}
	return nil
}

func (s *shipper) runs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.handled
	s.handled = nil
	return out
}

// message returns an SQS record as Lambda delivers it for the receiveCount-th time.
func message(id, body string, receiveCount int) events.SQSMessage {
	return events.SQSMessage{
		MessageId:     id,
		ReceiptHandle: "handle-" + id + "-" + strconv.Itoa(receiveCount),
		Body:          body,
		Attributes: map[string]string{
			"ApproximateReceiveCount":          strconv.Itoa(receiveCount),
			"SentTimestamp":                    "1767225600000",
			"ApproximateFirstReceiveTimestamp": strconv.Itoa(1767225600000 + receiveCount*30000),
		},
		MessageAttributes: map[string]events.SQSMessageAttribute{
			"tenant": {DataType: "String", StringValue: ptr("acme")},
		},
		EventSourceARN: "arn:aws:sqs:eu-west-1:123456789012:orders",
		EventSource:    "aws:sqs",
	}
}

func ptr[T any](v T) *T { return &v }

// failures invokes a batch handler with event and returns the
// ItemIdentifiers of its response.
func failures(t *testing.T, fn, event any) []string {
	t.Helper()
	body, err := invoke(context.Background(), fn, event)
	require.NoError(t, err, "a batch handler never fails the whole batch")
	var ids []string
	for _, f := range decode[events.SQSEventResponse](t, body).BatchItemFailures {
		ids = append(ids, f.ItemIdentifier)
	}
	return ids
}

func TestSQSBatch(t *testing.T) {
	forEachRedis(t, func(t *testing.T, addr string) {
		s := &shipper{fail: map[string]int{`{"order":"o-2"}`: 1}}
		orderID := idem.KeyFromJSON("/order")
		fn := idemlambda.SQS(newInstance(t, addr).guard, s.ship,
			idemlambda.WithSQSKey(func(m events.SQSMessage) (string, error) { return orderID(nil, []byte(m.Body)) }))

		// o-5 was handled by an earlier batch.
		require.Empty(t, failures(t, fn, events.SQSEvent{Records: []events.SQSMessage{
			message("m-5", `{"order":"o-5"}`, 1),
		}}))
		require.Equal(t, []string{`{"order":"o-5"}#1`}, s.runs())

		batch := func(receiveCount int) events.SQSEvent {
			return events.SQSEvent{Records: []events.SQSMessage{
				message("m-1", `{"order":"o-1"}`, receiveCount),
				message("m-2", `{"order":"o-2"}`, receiveCount),   // fails once
				message("m-3", `{"no":"order id"}`, receiveCount), // keyless
				message("m-4", `{"order":"o-4"}`, receiveCount),
				message("m-5", `{"order":"o-5"}`, receiveCount+1), // done: redelivered once more
			}}
		}
		require.Equal(t, []string{"m-2", "m-3"}, failures(t, fn, batch(1)),
			"exactly the failed and the keyless record")
		require.Equal(t, []string{`{"order":"o-1"}#1`, `{"order":"o-2"}#1`, `{"order":"o-4"}#1`}, s.runs(),
			"the done record skipped")

		// SQS redelivers the whole batch (a receive count higher, new
		// receipt handles): only the failed record runs again.
		require.Equal(t, []string{"m-3"}, failures(t, fn, batch(2)))
		require.Equal(t, []string{`{"order":"o-2"}#2`}, s.runs())
	})
}

func TestSQSRepeatsCompareBodyAndAttributes(t *testing.T) {
	forEachRedis(t, func(t *testing.T, addr string) {
		s := &shipper{}
		orderID := idem.KeyFromJSON("/order")
		fn := idemlambda.SQS(newInstance(t, addr).guard, s.ship,
			idemlambda.WithSQSKey(func(m events.SQSMessage) (string, error) { return orderID(nil, []byte(m.Body)) }))
		first := message("m-1", `{"order":"o-1","qty":1}`, 1)
		resent := message("m-9", `{"order":"o-1","qty":1}`, 1) // the producer sent it twice
		changed := message("m-10", `{"order":"o-1","qty":2}`, 1)
		relabelled := message("m-11", `{"order":"o-1","qty":1}`, 1)
		relabelled.MessageAttributes["tenant"] = events.SQSMessageAttribute{DataType: "String", StringValue: ptr("globex")}
		require.Equal(t, []string{"m-10", "m-11"}, failures(t, fn,
			events.SQSEvent{Records: []events.SQSMessage{first, resent, changed, relabelled}}),
			"another body, other attributes: idem.ErrMismatch")
		require.Equal(t, []string{`{"order":"o-1","qty":1}#1`}, s.runs())
	})
}

func TestSQSPermanentAndBusy(t *testing.T) {
	forEachRedis(t, func(t *testing.T, addr string) {
		s := &shipper{permanent: map[string]bool{"bad": true}, started: make(chan struct{}, 1), release: make(chan struct{})}
		fn := idemlambda.SQS(newInstance(t, addr).guard, s.ship)
		batch := events.SQSEvent{Records: []events.SQSMessage{message("m-1", "bad", 1)}}
		require.Equal(t, []string{"m-1"}, failures(t, fn, batch))
		require.Equal(t, []string{"m-1"}, failures(t, fn, batch),
			"a Permanent error is stored: reported again, toward the dead-letter queue")
		require.Equal(t, []string{"bad#1"}, s.runs(), "and not run again")

		done := make(chan error, 1)
		go func() {
			_, err := invoke(context.Background(), fn, events.SQSEvent{Records: []events.SQSMessage{message("m-2", "slow", 1)}})
			done <- err
		}()
		<-s.started
		other := idemlambda.SQS(newInstance(t, addr).guard, s.ship) // another instance, no WithWait
		require.Equal(t, []string{"m-2"}, failures(t, other, events.SQSEvent{Records: []events.SQSMessage{
			message("m-2", "slow", 2), message("m-3", "quick", 1),
		}}), "a record another instance still runs is delivered again")
		close(s.release)
		require.NoError(t, <-done)
		require.ElementsMatch(t, []string{"quick#1", "slow#1"}, s.runs())
	})
}

func TestSQSFIFOGroups(t *testing.T) {
	s := &shipper{fail: map[string]int{"a1": 1}}
	g := newInstance(t, miniredisAddr(t)).guard
	fifo := func(id, body, group string) events.SQSMessage {
		m := message(id, body, 1)
		m.EventSourceARN += ".fifo"
		m.Attributes["MessageGroupId"] = group
		return m
	}
	batch := events.SQSEvent{Records: []events.SQSMessage{
		fifo("m-1", "a1", "a"), fifo("m-2", "b1", "b"), fifo("m-3", "a2", "a"), fifo("m-4", "b2", "b"),
	}}
	require.Equal(t, []string{"m-1", "m-3"}, failures(t, idemlambda.SQS(g, s.ship), batch),
		"a2 waits behind a1, which failed; group b goes on")
	require.Equal(t, []string{"a1#1", "b1#1", "b2#1"}, s.runs())

	// On a standard queue a group id (fair queues) orders nothing.
	s = &shipper{fail: map[string]int{"c1": 1}}
	standard := func(id, body string) events.SQSMessage {
		m := message(id, body, 1)
		m.Attributes["MessageGroupId"] = "c"
		return m
	}
	require.Equal(t, []string{"m-5"}, failures(t, idemlambda.SQS(g, s.ship),
		events.SQSEvent{Records: []events.SQSMessage{standard("m-5", "c1"), standard("m-6", "c2")}}))
	require.Equal(t, []string{"c1#1", "c2#1"}, s.runs())
}

func TestSQSStoreDown(t *testing.T) {
	s := &shipper{}
	in := newInstance(t, miniredisAddr(t))
	in.store.Down.Store(true)
	require.Equal(t, []string{"m-1", "m-2"}, failures(t, idemlambda.SQS(in.guard, s.ship),
		events.SQSEvent{Records: []events.SQSMessage{message("m-1", "x", 1), message("m-2", "y", 1)}}))
	require.Empty(t, s.runs())
}
