package idemotel_test

import (
	"context"
	"fmt"
	"slices"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemotel"
)

func ExampleObserver() {
	mr := miniredis.NewMiniRedis() // an embedded Redis for the example; use yours in production
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	// In production: the providers of your SDK setup (or nil for the otel
	// globals), with a Prometheus or OTLP exporter. Here: a reader and an
	// exporter the example can print.
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	ctx := context.Background()
	defer mp.Shutdown(ctx)
	defer tp.Shutdown(ctx)

	g := idem.New(idem.NewRedisStore(rdb), idem.WithObserver(idemotel.Observer(mp, tp)))

	ctx, span := tp.Tracer("shop").Start(ctx, "checkout")
	charge := func(ctx context.Context, a *idem.Attempt) (string, error) {
		_, span := tp.Tracer("shop").Start(ctx, "payments.charge") // a child of idem.do
		defer span.End()
		return "ch_1", nil
	}
	for _, req := range []string{"pay 10 EUR", "pay 10 EUR", "pay 99 EUR"} {
		_, _ = idem.Do(ctx, g, "order-42", req, charge)
	}
	span.End()

	var rm metricdata.ResourceMetrics
	_ = reader.Collect(ctx, &rm)
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
			var lines []string
			for _, dp := range sum.DataPoints {
				kind, _ := dp.Attributes.Value("idem.kind")
				outcome, _ := dp.Attributes.Value("idem.outcome")
				lines = append(lines, fmt.Sprintf("%s{idem.kind=%s,idem.outcome=%s} %d",
					m.Name, kind.AsString(), outcome.AsString(), dp.Value))
			}
			slices.Sort(lines)
			for _, l := range lines {
				fmt.Println(l)
			}
		}
	}
	names := map[string]string{} // span id → name
	for _, s := range spans.GetSpans() {
		names[s.SpanContext.SpanID().String()] = s.Name
	}
	for _, s := range spans.GetSpans() {
		attrs := map[string]string{}
		for _, kv := range s.Attributes {
			attrs[string(kv.Key)] = kv.Value.String()
		}
		line := s.Name
		if parent := names[s.Parent.SpanID().String()]; parent != "" {
			line += " in " + parent
		}
		if o, ok := attrs["idem.outcome"]; ok {
			line += fmt.Sprintf(": idem.outcome=%s idem.fence=%s idem.replayed=%s", o, attrs["idem.fence"], attrs["idem.replayed"])
		}
		fmt.Println(line)
	}
	// Output:
	// idem.operations{idem.kind=do,idem.outcome=executed} 1
	// idem.operations{idem.kind=do,idem.outcome=mismatch} 1
	// idem.operations{idem.kind=do,idem.outcome=replayed} 1
	// payments.charge in idem.do
	// idem.do in checkout: idem.outcome=executed idem.fence=1 idem.replayed=false
	// idem.do in checkout: idem.outcome=replayed idem.fence=1 idem.replayed=true
	// idem.do in checkout: idem.outcome=mismatch idem.fence=1 idem.replayed=false
	// checkout
}
