package idemlambda

import (
	"context"
	"reflect"
	"strings"

	"github.com/aws/aws-lambda-go/events"

	"github.com/idemkit/idem"
)

// SQS returns a Lambda handler for SQS batches that runs h once per record
// key (its MessageId, or WithSQSKey's key), across redeliveries and every
// instance sharing g's store. Give it to lambda.Start, with
// ReportBatchItemFailures set on the event source mapping so that Lambda
// reads its answer:
//
//	lambda.Start(idemlambda.SQS(g, func(ctx context.Context, m events.SQSMessage) error {
//		return ship(ctx, m.Body)
//	}))
//
// The records run one after another, each with a lease that ends a second
// after the invocation's deadline (LeaseContext) and the Attempt in its
// context (idem.AttemptFrom). BatchItemFailures lists, by MessageId, every
// record that is to be delivered again:
//
//   - h returned an error (the key is released: the redelivery runs h, with
//     Attempt.Fence one higher), or an idem.Permanent error, now or stored
//     before (h does not run again; the record ends in the queue's
//     dead-letter queue after its receive count);
//   - its key could not be made (WithSQSKey's function failed or returned
//     "": ErrNoKey) or idem refused it (idem.ErrInvalidKey);
//   - another instance is still running its key (idem.ErrInProgress, after
//     the Guard's idem.WithWait);
//   - its key was used by a record with another body or other message
//     attributes (idem.ErrMismatch);
//   - the store is unreachable (idem.ErrStoreUnavailable; h does not run), or
//     the invocation's deadline passed before its turn;
//   - on a FIFO queue (an event source ARN ending in ".fifo"), an earlier
//     record of its message group failed: it is not run, so that the
//     group's order holds.
//
// A record whose key is done (h succeeded for it before, in this instance or
// another) is skipped: not run, not reported, so SQS deletes it. A record
// that h handled but whose completion could not be stored (idem.ErrNotRecorded,
// logged by the Guard) counts as done. Each reported record is logged at
// warning level with the reason (WithLogger). The handler's error is always
// nil; a panic in h releases its key and continues, and Lambda retries the
// whole batch, whose done records are skipped.
//
// A record is "the same" as an earlier one with its key when its body and
// message attributes are, or the JSON of WithFingerprint's value: envelope
// fields (ApproximateReceiveCount, SentTimestamp, the receipt handle) change
// between deliveries and are never compared.
//
// SQS panics on a nil Guard or h, or an option that does not apply, at
// construction.
func SQS(g *idem.Guard, h func(ctx context.Context, m events.SQSMessage) error, opts ...Option) func(ctx context.Context, e events.SQSEvent) (events.SQSEventResponse, error) {
	switch {
	case g == nil:
		panic("idemlambda: SQS with a nil Guard")
	case h == nil:
		panic("idemlambda: SQS with a nil handler")
	}
	c := newConfig("SQS", reflect.TypeFor[events.SQSMessage](), opts)
	s := source[events.SQSMessage]{
		name:  "SQS",
		ident: func(m events.SQSMessage) string { return m.MessageId },
		key:   c.sqsKey,
		fp:    recordFingerprint(fingerprintOf[events.SQSMessage](c), sqsFingerprint),
		group: fifoGroup,
	}
	if s.key == nil {
		s.key = func(m events.SQSMessage) (string, error) { return m.MessageId, nil }
	}
	return func(ctx context.Context, e events.SQSEvent) (events.SQSEventResponse, error) {
		ids := runBatch(ctx, g, c, s, e.Records, h)
		resp := events.SQSEventResponse{BatchItemFailures: make([]events.SQSBatchItemFailure, len(ids))}
		for i, id := range ids {
			resp.BatchItemFailures[i].ItemIdentifier = id
		}
		return resp, nil
	}
}

// sqsPayload is what is compared of an SQS record by default.
type sqsPayload struct {
	Body       string                                `json:"body"`
	Attributes map[string]events.SQSMessageAttribute `json:"messageAttributes,omitempty"`
}

func sqsFingerprint(m events.SQSMessage) (any, error) {
	return sqsPayload{Body: m.Body, Attributes: m.MessageAttributes}, nil
}

// fifoGroup returns the message group of a record of a FIFO queue.
func fifoGroup(m events.SQSMessage) (string, bool) {
	if !strings.HasSuffix(m.EventSourceARN, ".fifo") {
		return "", false
	}
	return m.Attributes["MessageGroupId"], true
}

// recordFingerprint returns custom, marked apart as Handler marks it, or
// def when there is none.
func recordFingerprint[R any](custom func(R) (any, error), def func(R) (any, error)) func(R) (any, error) {
	if custom == nil {
		return def
	}
	return func(r R) (any, error) { return request(custom, r) }
}
