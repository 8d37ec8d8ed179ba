package idemlambda_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/contrib/idemlambda"
)

func TestOptionsRejected(t *testing.T) {
	g := newInstance(t, miniredisAddr(t)).guard
	h := func(context.Context, Order) (Receipt, error) { return Receipt{}, nil }
	m := func(context.Context, events.SQSMessage) error { return nil }
	k := func(context.Context, events.KinesisEventRecord) error { return nil }
	d := func(context.Context, events.DynamoDBEventRecord) error { return nil }
	sqsKey := idemlambda.WithSQSKey(func(events.SQSMessage) (string, error) { return "", nil })
	orderFP := idemlambda.WithFingerprint(func(Order) (any, error) { return nil, nil })
	for _, tc := range []struct {
		name  string
		make  func()
		panic string
	}{
		{"nil Guard", func() { idemlambda.Handler(nil, orderKey, h) }, "idemlambda: Handler with a nil Guard"},
		{"nil key", func() { idemlambda.Handler[Order, Receipt](g, nil, h) }, "idemlambda: Handler with a nil key function"},
		{"nil handler", func() { idemlambda.Handler[Order, Receipt](g, orderKey, nil) }, "idemlambda: Handler with a nil handler"},
		{"SQS nil Guard", func() { idemlambda.SQS(nil, m) }, "idemlambda: SQS with a nil Guard"},
		{"SQS nil handler", func() { idemlambda.SQS(g, nil) }, "idemlambda: SQS with a nil handler"},
		{"Kinesis nil handler", func() { idemlambda.Kinesis(g, nil) }, "idemlambda: Kinesis with a nil handler"},
		{"DynamoDB nil Guard", func() { idemlambda.DynamoDB(nil, d) }, "idemlambda: DynamoDB with a nil Guard"},
		{"WithSQSKey(nil)", func() { idemlambda.WithSQSKey(nil) }, "idemlambda: WithSQSKey(nil)"},
		{"WithKinesisKey(nil)", func() { idemlambda.WithKinesisKey(nil) }, "idemlambda: WithKinesisKey(nil)"},
		{"WithDynamoDBKey(nil)", func() { idemlambda.WithDynamoDBKey(nil) }, "idemlambda: WithDynamoDBKey(nil)"},
		{"WithFingerprint(nil)", func() { idemlambda.WithFingerprint[Order](nil) }, "idemlambda: WithFingerprint(nil)"},
		{"WithSQSKey to Handler", func() { idemlambda.Handler(g, orderKey, h, sqsKey) }, "idemlambda: Handler: WithSQSKey is an option of SQS"},
		{"WithSQSKey to Kinesis", func() { idemlambda.Kinesis(g, k, sqsKey) }, "idemlambda: Kinesis: WithSQSKey is an option of SQS"},
		{"a fingerprint of orders to SQS", func() { idemlambda.SQS(g, m, orderFP) },
			"idemlambda: SQS: WithFingerprint for idemlambda_test.Order, but the events are events.SQSMessage"},
	} {
		t.Run(tc.name, func(t *testing.T) { require.PanicsWithValue(t, tc.panic, tc.make) })
	}
	require.NotPanics(t, func() {
		idemlambda.SQS(g, m, sqsKey, nil, idemlambda.WithFingerprint(func(events.SQSMessage) (any, error) { return nil, nil }))
	})
}

func TestBatchLogsFailures(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
	fn := idemlambda.SQS(newInstance(t, miniredisAddr(t)).guard, func(context.Context, events.SQSMessage) error {
		return errors.New("warehouse unreachable")
	}, idemlambda.WithLogger(log))
	require.Equal(t, []string{"m-1"}, failures(t, fn, events.SQSEvent{Records: []events.SQSMessage{message("m-1", "x", 1)}}))
	require.Equal(t, `level=WARN msg="idemlambda: record failed" source=SQS item=m-1 error="warehouse unreachable"`+"\n", buf.String())
}
