package idemotel_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemotel"
)

// telemetry is an SDK meter provider read by a manual reader and an SDK
// tracer provider recording its ended spans, with an Observer on both.
type telemetry struct {
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	mp     *sdkmetric.MeterProvider
	tp     *sdktrace.TracerProvider
	obs    idem.Observer
}

func newTelemetry(t *testing.T, opts ...idemotel.Option) *telemetry {
	t.Helper()
	tel := &telemetry{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	tel.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(tel.reader))
	tel.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tel.spans))
	t.Cleanup(func() {
		_ = tel.mp.Shutdown(context.Background())
		_ = tel.tp.Shutdown(context.Background())
	})
	tel.obs = idemotel.Observer(tel.mp, tel.tp, opts...)
	return tel
}

// caller starts a span for the caller of an operation, as a server
// instrumentation or the application would, on a tracer of its own.
func (tel *telemetry) caller(ctx context.Context) (context.Context, trace.Span) {
	return tel.tp.Tracer("app").Start(ctx, "caller")
}

// series is the attributes of a data point: kind and outcome.
type series struct{ kind, outcome string }

func seriesOf(t *testing.T, set attribute.Set) series {
	t.Helper()
	require.Equal(t, 2, set.Len(), "attributes: %v", set.ToSlice())
	k, ok := set.Value(idemotel.KeyKind)
	require.True(t, ok, "no idem.kind in %v", set.ToSlice())
	o, ok := set.Value(idemotel.KeyOutcome)
	require.True(t, ok, "no idem.outcome in %v", set.ToSlice())
	return series{k.AsString(), o.AsString()}
}

// metrics is one collection, by instrument name.
type metrics map[string]metricdata.Metrics

func (tel *telemetry) collect(t *testing.T) metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, tel.reader.Collect(context.Background(), &rm))
	out := metrics{}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, idemotel.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// counts returns the idem.operations counter's values by series.
func (m metrics) counts(t *testing.T) map[series]int64 {
	t.Helper()
	out := map[series]int64{}
	c, ok := m["idem.operations"]
	if !ok {
		return out
	}
	sum, ok := c.Data.(metricdata.Sum[int64])
	require.True(t, ok, "idem.operations is a %T", c.Data)
	require.True(t, sum.IsMonotonic)
	for _, dp := range sum.DataPoints {
		out[seriesOf(t, dp.Attributes)] = dp.Value
	}
	return out
}

// hist returns a histogram's data points by series.
func (m metrics) hist(t *testing.T, name string) map[series]metricdata.HistogramDataPoint[float64] {
	t.Helper()
	out := map[series]metricdata.HistogramDataPoint[float64]{}
	h, ok := m[name]
	if !ok {
		return out
	}
	require.Equal(t, "s", h.Unit, name)
	data, ok := h.Data.(metricdata.Histogram[float64])
	require.True(t, ok, "%s is a %T", name, h.Data)
	for _, dp := range data.DataPoints {
		out[seriesOf(t, dp.Attributes)] = dp
	}
	return out
}

// spanAttrs returns a span's attributes by key.
func spanAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value
	}
	return out
}

// spanNamed returns the one ended span of that name.
func (tel *telemetry) spanNamed(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	found := tel.spansNamed(name)
	require.Len(t, found, 1, "spans named %s", name)
	return found[0]
}

// spansNamed returns the ended spans of that name.
func (tel *telemetry) spansNamed(name string) []sdktrace.ReadOnlySpan {
	var found []sdktrace.ReadOnlySpan
	for _, s := range tel.spans.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	return found
}
