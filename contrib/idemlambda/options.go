package idemlambda

import (
	"errors"
	"fmt"
	"log/slog"
	"reflect"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambdacontext"
)

// ErrNoKey reports an event or a record without an idempotency key: the key
// function returned an error or "". Such an event is refused (Handler
// returns the error, a batch reports the record as failed), never processed
// unprotected.
var ErrNoKey = errors.New("idemlambda: no idempotency key")

// An Option configures Handler, SQS, Kinesis or DynamoDB. An option that
// does not apply to the function it is given to (WithSQSKey to Kinesis,
// WithFingerprint for another event type) panics at construction.
type Option func(*config)

type config struct {
	scope       string
	fingerprint any          // func(In) (any, error) of WithFingerprint
	fpType      reflect.Type // its In
	sqsKey      func(events.SQSMessage) (string, error)
	kinesisKey  func(events.KinesisEventRecord) (string, error)
	dynamoKey   func(events.DynamoDBEventRecord) (string, error)
	logger      *slog.Logger
}

// WithScope sets the scope of the keys: the key of an event is
// "<scope>/<key>", so that two functions sharing one Redis never take each
// other's keys for their own. Default: the function's name
// (AWS_LAMBDA_FUNCTION_NAME, the same in every version and alias of the
// function); outside Lambda, where it is unset, no scope. An empty scope
// shares keys with every function that also has none.
func WithScope(scope string) Option {
	return func(c *config) { c.scope = scope }
}

// WithFingerprint sets what is compared between events with one key: the
// JSON of what f returns for an event, instead of the whole event (Handler),
// the body and message attributes (SQS), the data (Kinesis) or the change
// (DynamoDB). Use it when a field changes between deliveries of one event
// (a sent-at time, an attempt count):
//
//	idemlambda.WithFingerprint(func(o Order) (any, error) { return []any{o.Customer, o.Items}, nil })
//
// idem.FingerprintJSON compares chosen members of a JSON text (an SQS body):
//
//	fp := idem.FingerprintJSON("/type", "/data")
//	idemlambda.WithFingerprint(func(m events.SQSMessage) (any, error) { return fp(nil, []byte(m.Body)) })
//
// Equal JSON is a repeat; other JSON is idem.ErrMismatch. An error from f
// refuses the event (or fails the record) before anything runs. In must be
// the event type of the function the option is given to (events.SQSMessage
// for SQS, events.KinesisEventRecord for Kinesis, events.DynamoDBEventRecord
// for DynamoDB), or the constructor panics; so does a nil f.
func WithFingerprint[In any](f func(in In) (any, error)) Option {
	if f == nil {
		panic("idemlambda: WithFingerprint(nil)")
	}
	return func(c *config) { c.fingerprint, c.fpType = f, reflect.TypeFor[In]() }
}

// WithSQSKey keys SQS records by what f returns for them instead of their
// MessageId: an id in the body, for producers that send one event twice as
// two messages (a retried SendMessage, a webhook relayed to the queue).
// idem.KeyFromJSON reads a member of a JSON body:
//
//	id := idem.KeyFromJSON("/order_id")
//	idemlambda.WithSQSKey(func(m events.SQSMessage) (string, error) { return id(nil, []byte(m.Body)) })
//
// An error from f, or "", fails the record with ErrNoKey. Only for SQS; a
// nil f panics.
func WithSQSKey(f func(m events.SQSMessage) (string, error)) Option {
	if f == nil {
		panic("idemlambda: WithSQSKey(nil)")
	}
	return func(c *config) { c.sqsKey = f }
}

// WithKinesisKey keys Kinesis records by what f returns for them instead of
// their EventID (shard and sequence number): an id in the data, for
// producers whose retried PutRecord wrote one event twice. An error from f,
// or "", fails the record with ErrNoKey. Only for Kinesis; a nil f panics.
func WithKinesisKey(f func(r events.KinesisEventRecord) (string, error)) Option {
	if f == nil {
		panic("idemlambda: WithKinesisKey(nil)")
	}
	return func(c *config) { c.kinesisKey = f }
}

// WithDynamoDBKey keys DynamoDB stream records by what f returns for them
// instead of their EventID: an attribute of the item, for writers whose
// retried write changed the item twice. An error from f, or "", fails the
// record with ErrNoKey. Only for DynamoDB; a nil f panics.
func WithDynamoDBKey(f func(r events.DynamoDBEventRecord) (string, error)) Option {
	if f == nil {
		panic("idemlambda: WithDynamoDBKey(nil)")
	}
	return func(c *config) { c.dynamoKey = f }
}

// WithLogger sets where SQS, Kinesis and DynamoDB log each record they
// report as failed, with its identifier and the reason, at warning level
// (the Guard logs its own events with idem.WithLogger; Handler returns its
// errors to Lambda, which logs them). Default: slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// newConfig applies opts for the function named fn (Handler, SQS, Kinesis,
// DynamoDB), whose events are of type in.
func newConfig(fn string, in reflect.Type, opts []Option) *config {
	c := &config{scope: lambdacontext.FunctionName}
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	if c.fingerprint != nil && c.fpType != in {
		panic(fmt.Sprintf("idemlambda: %s: WithFingerprint for %s, but the events are %s", fn, c.fpType, in))
	}
	keys := []struct {
		name string
		set  bool
		of   string
	}{
		{"WithSQSKey", c.sqsKey != nil, "SQS"},
		{"WithKinesisKey", c.kinesisKey != nil, "Kinesis"},
		{"WithDynamoDBKey", c.dynamoKey != nil, "DynamoDB"},
	}
	for _, k := range keys {
		if k.set && k.of != fn {
			panic(fmt.Sprintf("idemlambda: %s: %s is an option of %s", fn, k.name, k.of))
		}
	}
	return c
}

// fingerprintOf returns WithFingerprint's function for events of type In,
// or nil.
func fingerprintOf[In any](c *config) func(In) (any, error) {
	f, _ := c.fingerprint.(func(In) (any, error))
	return f
}

// key returns the scoped key of an event whose key is k.
func (c *config) key(k string) string {
	if c.scope == "" {
		return k
	}
	return c.scope + "/" + k
}

// customFingerprint marks what WithFingerprint's function returned, so that
// it never compares equal to a whole event.
type customFingerprint struct {
	Custom any `json:"idemlambda_fingerprint"`
}

// request returns what idem.Do fingerprints for in: in itself, or the
// value of fp.
func request[In any](fp func(In) (any, error), in In) (any, error) {
	if fp == nil {
		return in, nil
	}
	v, err := fp(in)
	if err != nil {
		return nil, fmt.Errorf("idemlambda: fingerprint: %w", err)
	}
	return customFingerprint{v}, nil
}
