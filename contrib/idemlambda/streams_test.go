package idemlambda_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemlambda"
)

// recorder records the records a stream consumer handled and fails those
// named in fail once each.
type recorder struct {
	mu      sync.Mutex
	handled []string
	fail    map[string]bool
}

func (r *recorder) handle(ctx context.Context, name string) error {
	if _, ok := idem.AttemptFrom(ctx); !ok {
		return errors.New("no Attempt in the record's context")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.handled = append(r.handled, name)
	if r.fail[name] {
		delete(r.fail, name)
		return errors.New("downstream refused")
	}
	return nil
}

func (r *recorder) runs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.handled
	r.handled = nil
	return out
}

// streamFailures invokes a stream handler and returns its ItemIdentifiers.
func streamFailures(t *testing.T, fn, event any) []string {
	t.Helper()
	body, err := invoke(context.Background(), fn, event)
	require.NoError(t, err)
	var ids []string
	for _, f := range decode[events.KinesisEventResponse](t, body).BatchItemFailures {
		ids = append(ids, f.ItemIdentifier)
	}
	return ids
}

func kinesisRecord(seq, data string, arrival int64) events.KinesisEventRecord {
	return events.KinesisEventRecord{
		EventID:     "shardId-000000000000:" + seq,
		EventName:   "aws:kinesis:record",
		EventSource: "aws:kinesis",
		Kinesis: events.KinesisRecord{
			Data: []byte(data), PartitionKey: "p", SequenceNumber: seq,
			ApproximateArrivalTimestamp: events.SecondsEpochTime{Time: time.Unix(1767225600+arrival, 0)},
		},
	}
}

func TestKinesisStopsAtFirstFailure(t *testing.T) {
	forEachRedis(t, func(t *testing.T, addr string) {
		r := &recorder{fail: map[string]bool{"e2": true}}
		fn := idemlambda.Kinesis(newInstance(t, addr).guard, func(ctx context.Context, rec events.KinesisEventRecord) error {
			return r.handle(ctx, string(rec.Kinesis.Data))
		})
		shard := []events.KinesisEventRecord{
			kinesisRecord("101", "e1", 1), kinesisRecord("102", "e2", 2), kinesisRecord("103", "e3", 3),
		}
		require.Equal(t, []string{"102"}, streamFailures(t, fn, events.KinesisEvent{Records: shard}),
			"the first failure alone: Lambda retries the shard from it")
		require.Equal(t, []string{"e1", "e2"}, r.runs(), "e3 does not run ahead of e2")

		// Lambda retries from 102 (here with 101 again, as a bisected or
		// replayed batch brings it): the done record is skipped.
		require.Empty(t, streamFailures(t, fn, events.KinesisEvent{Records: shard}))
		require.Equal(t, []string{"e2", "e3"}, r.runs())
	})
}

func TestKinesisKeyFromData(t *testing.T) {
	r := &recorder{}
	id := idem.KeyFromJSON("/event_id")
	fn := idemlambda.Kinesis(newInstance(t, miniredisAddr(t)).guard, func(ctx context.Context, rec events.KinesisEventRecord) error {
		return r.handle(ctx, rec.Kinesis.SequenceNumber)
	}, idemlambda.WithKinesisKey(func(rec events.KinesisEventRecord) (string, error) { return id(nil, rec.Kinesis.Data) }))
	// A producer's retried PutRecord wrote the event twice, under two
	// sequence numbers; a third record has no id.
	require.Equal(t, []string{"203"}, streamFailures(t, fn, events.KinesisEvent{Records: []events.KinesisEventRecord{
		kinesisRecord("201", `{"event_id":"ev-1"}`, 1),
		kinesisRecord("202", `{"event_id":"ev-1"}`, 2),
		kinesisRecord("203", `{"no":"id"}`, 3),
		kinesisRecord("204", `{"event_id":"ev-2"}`, 4),
	}}))
	require.Equal(t, []string{"201"}, r.runs())
}

func dynamoRecord(seq, eventID, id, status string) events.DynamoDBEventRecord {
	return events.DynamoDBEventRecord{
		EventID:   eventID,
		EventName: "MODIFY",
		Change: events.DynamoDBStreamRecord{
			SequenceNumber: seq,
			SizeBytes:      int64(len(seq)),
			Keys:           map[string]events.DynamoDBAttributeValue{"id": events.NewStringAttribute(id)},
			NewImage: map[string]events.DynamoDBAttributeValue{
				"id": events.NewStringAttribute(id), "status": events.NewStringAttribute(status),
			},
		},
	}
}

func TestDynamoDBStream(t *testing.T) {
	forEachRedis(t, func(t *testing.T, addr string) {
		r := &recorder{fail: map[string]bool{"order-2 shipped": true}}
		fn := idemlambda.DynamoDB(newInstance(t, addr).guard, func(ctx context.Context, rec events.DynamoDBEventRecord) error {
			return r.handle(ctx, rec.Change.NewImage["id"].String()+" "+rec.Change.NewImage["status"].String())
		})
		shard := []events.DynamoDBEventRecord{
			dynamoRecord("301", "ev-1", "order-1", "shipped"),
			dynamoRecord("302", "ev-2", "order-2", "shipped"),
			dynamoRecord("303", "ev-3", "order-3", "shipped"),
		}
		require.Equal(t, []string{"302"}, streamFailures(t, fn, events.DynamoDBEvent{Records: shard}))
		require.Equal(t, []string{"order-1 shipped", "order-2 shipped"}, r.runs())
		require.Empty(t, streamFailures(t, fn, events.DynamoDBEvent{Records: shard[1:]}))
		require.Equal(t, []string{"order-2 shipped", "order-3 shipped"}, r.runs())

		changed := dynamoRecord("304", "ev-3", "order-3", "cancelled") // a record id with another change
		require.Equal(t, []string{"304"}, streamFailures(t, fn, events.DynamoDBEvent{Records: []events.DynamoDBEventRecord{changed}}))
		require.Empty(t, r.runs())
	})
}
