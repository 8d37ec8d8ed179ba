package idemlambda

import (
	"context"
	"reflect"

	"github.com/aws/aws-lambda-go/events"

	"github.com/idemkit/idem"
)

// Kinesis returns a Lambda handler for Kinesis batches that runs h once per
// record key (its EventID, shard and sequence number, or WithKinesisKey's
// key), across retries and every instance sharing g's store. Set
// ReportBatchItemFailures on the event source mapping.
//
// A batch is one shard, in order: the records run one after another until
// one fails (for the reasons SQS lists), which is reported alone in
// BatchItemFailures by its sequence number; the records after it do not run,
// and Lambda retries the shard from it. Records whose key is done are
// skipped. A record is "the same" as an earlier one with its key when its
// data is (or the JSON of WithFingerprint's value, for
// events.KinesisEventRecord); the arrival time and the sequence number are
// not compared.
//
// Kinesis panics on a nil Guard or h, or an option that does not apply, at
// construction.
func Kinesis(g *idem.Guard, h func(ctx context.Context, r events.KinesisEventRecord) error, opts ...Option) func(ctx context.Context, e events.KinesisEvent) (events.KinesisEventResponse, error) {
	switch {
	case g == nil:
		panic("idemlambda: Kinesis with a nil Guard")
	case h == nil:
		panic("idemlambda: Kinesis with a nil handler")
	}
	c := newConfig("Kinesis", reflect.TypeFor[events.KinesisEventRecord](), opts)
	s := source[events.KinesisEventRecord]{
		name:          "Kinesis",
		ident:         func(r events.KinesisEventRecord) string { return r.Kinesis.SequenceNumber },
		key:           c.kinesisKey,
		fp:            recordFingerprint(fingerprintOf[events.KinesisEventRecord](c), kinesisFingerprint),
		stopAtFailure: true,
	}
	if s.key == nil {
		s.key = func(r events.KinesisEventRecord) (string, error) { return r.EventID, nil }
	}
	return func(ctx context.Context, e events.KinesisEvent) (events.KinesisEventResponse, error) {
		ids := runBatch(ctx, g, c, s, e.Records, h)
		resp := events.KinesisEventResponse{BatchItemFailures: make([]events.KinesisBatchItemFailure, len(ids))}
		for i, id := range ids {
			resp.BatchItemFailures[i].ItemIdentifier = id
		}
		return resp, nil
	}
}

// kinesisPayload is what is compared of a Kinesis record by default.
type kinesisPayload struct {
	Data []byte `json:"data"`
}

func kinesisFingerprint(r events.KinesisEventRecord) (any, error) {
	return kinesisPayload{Data: r.Kinesis.Data}, nil
}

// DynamoDB returns a Lambda handler for DynamoDB stream batches that runs h
// once per record key (its EventID, or WithDynamoDBKey's key), across
// retries and every instance sharing g's store. Set ReportBatchItemFailures
// on the event source mapping.
//
// A batch is one shard, in order, as for Kinesis: the records run one after
// another until one fails, which is reported alone by its sequence number;
// the records after it do not run, and Lambda retries the shard from it.
// Records whose key is done are skipped. A record is "the same" as an
// earlier one with its key when its event name, keys and images are (or the
// JSON of WithFingerprint's value, for events.DynamoDBEventRecord); the
// creation time, size and sequence number are not compared.
//
// DynamoDB panics on a nil Guard or h, or an option that does not apply, at
// construction.
func DynamoDB(g *idem.Guard, h func(ctx context.Context, r events.DynamoDBEventRecord) error, opts ...Option) func(ctx context.Context, e events.DynamoDBEvent) (events.DynamoDBEventResponse, error) {
	switch {
	case g == nil:
		panic("idemlambda: DynamoDB with a nil Guard")
	case h == nil:
		panic("idemlambda: DynamoDB with a nil handler")
	}
	c := newConfig("DynamoDB", reflect.TypeFor[events.DynamoDBEventRecord](), opts)
	s := source[events.DynamoDBEventRecord]{
		name:          "DynamoDB",
		ident:         func(r events.DynamoDBEventRecord) string { return r.Change.SequenceNumber },
		key:           c.dynamoKey,
		fp:            recordFingerprint(fingerprintOf[events.DynamoDBEventRecord](c), dynamoFingerprint),
		stopAtFailure: true,
	}
	if s.key == nil {
		s.key = func(r events.DynamoDBEventRecord) (string, error) { return r.EventID, nil }
	}
	return func(ctx context.Context, e events.DynamoDBEvent) (events.DynamoDBEventResponse, error) {
		ids := runBatch(ctx, g, c, s, e.Records, h)
		resp := events.DynamoDBEventResponse{BatchItemFailures: make([]events.DynamoDBBatchItemFailure, len(ids))}
		for i, id := range ids {
			resp.BatchItemFailures[i].ItemIdentifier = id
		}
		return resp, nil
	}
}

// dynamoPayload is what is compared of a DynamoDB stream record by default.
type dynamoPayload struct {
	EventName string                                   `json:"eventName"`
	Keys      map[string]events.DynamoDBAttributeValue `json:"keys,omitempty"`
	NewImage  map[string]events.DynamoDBAttributeValue `json:"newImage,omitempty"`
	OldImage  map[string]events.DynamoDBAttributeValue `json:"oldImage,omitempty"`
}

func dynamoFingerprint(r events.DynamoDBEventRecord) (any, error) {
	return dynamoPayload{EventName: r.EventName, Keys: r.Change.Keys, NewImage: r.Change.NewImage, OldImage: r.Change.OldImage}, nil
}
