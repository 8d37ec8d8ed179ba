package idemotel_test

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemotel"
)

var benchEvent = idem.Event{Kind: idem.KindDo, Outcome: idem.OutcomeReplayed, Fence: 1, ID: "id",
	Duration: 3 * time.Millisecond, Wait: time.Millisecond, Store: time.Millisecond}

func BenchmarkEndMetricsOnly(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	o := idemotel.Observer(mp, tracenoop.NewTracerProvider())
	ctx := o.Start(context.Background(), idem.KindDo)
	b.ReportAllocs()
	for b.Loop() {
		o.End(ctx, benchEvent)
	}
}

func BenchmarkStartEnd(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tp := sdktrace.NewTracerProvider()
	o := idemotel.Observer(mp, tp)
	b.ReportAllocs()
	for b.Loop() {
		ctx := o.Start(context.Background(), idem.KindDo)
		o.End(ctx, benchEvent)
	}
}

// BenchmarkStartEndBaseline is the same span, opened and ended by hand,
// without the metrics.
func BenchmarkStartEndBaseline(b *testing.B) {
	tp := sdktrace.NewTracerProvider()
	tr := tp.Tracer("bench")
	b.ReportAllocs()
	for b.Loop() {
		_, span := tr.Start(context.Background(), "idem.do", trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(idemotel.KeyKind.String("do")))
		span.SetAttributes(idemotel.KeyOutcome.String("replayed"), idemotel.KeyFence.Int64(1),
			idemotel.KeyReplayed.Bool(true))
		span.End()
	}
}
