package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemotel"
)

var allOutcomes = []idem.Outcome{
	idem.OutcomeExecuted, idem.OutcomeReplayed, idem.OutcomeInProgress, idem.OutcomeMismatch,
	idem.OutcomeInvalidKey, idem.OutcomeTooLarge, idem.OutcomeStoreUnavailable, idem.OutcomeCanceled,
	idem.OutcomeLeaseLost, idem.OutcomeNotRecorded, idem.OutcomeReleased, idem.OutcomeUnreadable,
}

var allKinds = []idem.Kind{idem.KindDo, idem.KindOnce, idem.KindHTTP}

// failures are the outcomes whose span has status Error.
var failures = map[idem.Outcome]bool{
	idem.OutcomeStoreUnavailable: true,
	idem.OutcomeLeaseLost:        true,
	idem.OutcomeNotRecorded:      true,
	idem.OutcomeUnreadable:       true,
}

// run starts and ends one operation as the core does, under a caller's
// span.
func run(tel *telemetry, kind idem.Kind, e idem.Event) {
	ctx, caller := tel.caller(context.Background())
	defer caller.End()
	ctx = tel.obs.Start(ctx, kind)
	e.Kind = kind
	tel.obs.End(ctx, e)
}

func TestMetricsPerKindAndOutcome(t *testing.T) {
	tel := newTelemetry(t)
	want := map[series]int64{}
	for _, k := range allKinds {
		for i, o := range allOutcomes {
			// i+1 operations of each series, 10 ms each.
			for range i + 1 {
				run(tel, k, idem.Event{Outcome: o, Duration: 10 * time.Millisecond})
			}
			want[series{k.String(), string(o)}] = int64(i + 1)
		}
	}

	m := tel.collect(t)
	require.Equal(t, want, m.counts(t))
	require.Equal(t, "{operation}", m["idem.operations"].Unit)

	durations := m.hist(t, "idem.operation.duration")
	require.Len(t, durations, len(want))
	for s, n := range want {
		dp := durations[s]
		require.Equal(t, uint64(n), dp.Count, "%v", s)
		require.InDelta(t, 0.010*float64(n), dp.Sum, 1e-9, "%v", s)
	}
	// Nothing waited, nothing was measured in the store: no data points.
	require.Empty(t, m.hist(t, "idem.wait.duration"))
	require.Empty(t, m.hist(t, "idem.store.duration"))
}

func TestWaitAndStoreOnlyWhenMeasured(t *testing.T) {
	tel := newTelemetry(t)
	run(tel, idem.KindDo, idem.Event{Outcome: idem.OutcomeExecuted, Duration: 30 * time.Millisecond, Store: 2 * time.Millisecond})
	run(tel, idem.KindDo, idem.Event{Outcome: idem.OutcomeReplayed, Duration: 1500 * time.Millisecond,
		Wait: 1400 * time.Millisecond, Store: 5 * time.Millisecond})
	run(tel, idem.KindDo, idem.Event{Outcome: idem.OutcomeInProgress, Duration: 5 * time.Second, Wait: 5 * time.Second})
	run(tel, idem.KindDo, idem.Event{Outcome: idem.OutcomeReplayed, Duration: time.Millisecond})

	m := tel.collect(t)
	waits := m.hist(t, "idem.wait.duration")
	require.Len(t, waits, 2)
	require.Equal(t, uint64(1), waits[series{"do", "replayed"}].Count)
	require.InDelta(t, 1.4, waits[series{"do", "replayed"}].Sum, 1e-9)
	require.Equal(t, uint64(1), waits[series{"do", "in_progress"}].Count)
	require.InDelta(t, 5.0, waits[series{"do", "in_progress"}].Sum, 1e-9)

	store := m.hist(t, "idem.store.duration")
	require.Len(t, store, 2)
	require.InDelta(t, 0.002, store[series{"do", "executed"}].Sum, 1e-9)
	require.Equal(t, uint64(1), store[series{"do", "replayed"}].Count)

	durations := m.hist(t, "idem.operation.duration")
	require.Equal(t, uint64(2), durations[series{"do", "replayed"}].Count)
	require.InDelta(t, 1.501, durations[series{"do", "replayed"}].Sum, 1e-9)
}

func TestHistogramBucketsInSeconds(t *testing.T) {
	tel := newTelemetry(t)
	run(tel, idem.KindHTTP, idem.Event{Outcome: idem.OutcomeExecuted, Duration: 20 * time.Millisecond,
		Wait: 20 * time.Millisecond, Store: 700 * time.Microsecond})
	m := tel.collect(t)
	for _, name := range []string{"idem.operation.duration", "idem.wait.duration"} {
		dp := m.hist(t, name)[series{"http", "executed"}]
		require.Equal(t, []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30, 60},
			dp.Bounds, name)
		require.Equal(t, uint64(1), dp.BucketCounts[2], "%s: 20 ms falls in (10 ms, 25 ms]", name)
	}
	dp := m.hist(t, "idem.store.duration")[series{"http", "executed"}]
	require.Equal(t, 0.0005, dp.Bounds[0])
	require.Equal(t, uint64(1), dp.BucketCounts[1], "0.7 ms falls in (0.5 ms, 1 ms]")
}

func TestSpanIsChildOfCallerAndParentOfFn(t *testing.T) {
	for _, k := range allKinds {
		t.Run(k.String(), func(t *testing.T) {
			tel := newTelemetry(t)
			ctx, caller := tel.caller(context.Background())
			opCtx := tel.obs.Start(ctx, k)
			_, inner := tel.tp.Tracer("app").Start(opCtx, "inside fn")
			inner.End()
			tel.obs.End(opCtx, idem.Event{Kind: k, Outcome: idem.OutcomeExecuted, Fence: 3, ID: "op-id"})
			caller.End()

			op := tel.spanNamed(t, "idem."+k.String())
			require.Equal(t, caller.SpanContext().SpanID(), op.Parent().SpanID())
			require.Equal(t, caller.SpanContext().TraceID(), op.SpanContext().TraceID())
			require.Equal(t, op.SpanContext().SpanID(), tel.spanNamed(t, "inside fn").Parent().SpanID())
			require.Equal(t, trace.SpanKindInternal, op.SpanKind())
			require.Equal(t, idemotel.ScopeName, op.InstrumentationScope().Name)
			require.Equal(t, map[attribute.Key]attribute.Value{
				idemotel.KeyKind:     attribute.StringValue(k.String()),
				idemotel.KeyOutcome:  attribute.StringValue("executed"),
				idemotel.KeyFence:    attribute.Int64Value(3),
				idemotel.KeyReplayed: attribute.BoolValue(false),
			}, spanAttrs(op), "no idem.id without WithOperationID")
			require.Equal(t, codes.Unset, op.Status().Code)
			// The caller's context is untouched: its span is still the caller's.
			require.Equal(t, caller.SpanContext(), trace.SpanContextFromContext(ctx))
		})
	}
}

func TestSpanWithoutCallerIsRoot(t *testing.T) {
	tel := newTelemetry(t)
	ctx := tel.obs.Start(context.Background(), idem.KindOnce)
	tel.obs.End(ctx, idem.Event{Kind: idem.KindOnce, Outcome: idem.OutcomeReplayed, Fence: 1})
	op := tel.spanNamed(t, "idem.once")
	require.False(t, op.Parent().IsValid())
	require.Equal(t, attribute.BoolValue(true), spanAttrs(op)[idemotel.KeyReplayed])
}

func TestSpanStatusPerOutcome(t *testing.T) {
	for _, o := range allOutcomes {
		t.Run(string(o), func(t *testing.T) {
			tel := newTelemetry(t)
			err := fmt.Errorf("%w: dial tcp: connection refused", idem.ErrStoreUnavailable)
			run(tel, idem.KindDo, idem.Event{Outcome: o, Fence: 7, Err: err})
			op := tel.spanNamed(t, "idem.do")
			a := spanAttrs(op)
			require.Equal(t, string(o), a[idemotel.KeyOutcome].AsString())
			require.Equal(t, int64(7), a[idemotel.KeyFence].AsInt64())
			require.Equal(t, o == idem.OutcomeReplayed, a[idemotel.KeyReplayed].AsBool())
			if !failures[o] {
				require.Equal(t, codes.Unset, op.Status().Code)
				require.Empty(t, op.Events())
				return
			}
			require.Equal(t, codes.Error, op.Status().Code)
			require.Equal(t, err.Error(), op.Status().Description)
			require.Len(t, op.Events(), 1)
			require.Equal(t, "exception", op.Events()[0].Name)
		})
	}
}

func TestFailureWithoutErrorDescribedByOutcome(t *testing.T) {
	tel := newTelemetry(t)
	run(tel, idem.KindHTTP, idem.Event{Outcome: idem.OutcomeLeaseLost})
	op := tel.spanNamed(t, "idem.http")
	require.Equal(t, sdktrace.Status{Code: codes.Error, Description: "lease_lost"}, op.Status())
	require.Empty(t, op.Events())
}

func TestWithOperationID(t *testing.T) {
	tel := newTelemetry(t, idemotel.WithOperationID())
	id := idem.OperationID(idem.KindDo, "", "order-42")
	run(tel, idem.KindDo, idem.Event{Outcome: idem.OutcomeExecuted, ID: id, Fence: 1})
	run(tel, idem.KindHTTP, idem.Event{Outcome: idem.OutcomeInvalidKey}) // refused: no id

	require.Equal(t, attribute.StringValue(id), spanAttrs(tel.spanNamed(t, "idem.do"))[idemotel.KeyID])
	_, ok := spanAttrs(tel.spanNamed(t, "idem.http"))[idemotel.KeyID]
	require.False(t, ok, "an empty id is not an attribute")
	for _, s := range tel.spans.Ended() {
		for _, kv := range s.Attributes() {
			require.NotContains(t, kv.Value.String(), "order-42", "the key is never an attribute")
		}
	}
	// The metrics never carry the id: seriesOf requires exactly kind and outcome.
	m := tel.collect(t)
	require.Equal(t, map[series]int64{{"do", "executed"}: 1, {"http", "invalid_key"}: 1}, m.counts(t))
	m.hist(t, "idem.operation.duration")
}

func TestUnknownKindAndOutcome(t *testing.T) {
	tel := newTelemetry(t)
	run(tel, idem.Kind(9), idem.Event{Outcome: "postponed"})
	run(tel, idem.KindDo, idem.Event{Outcome: "postponed"})
	run(tel, idem.Kind(-1), idem.Event{Outcome: idem.OutcomeExecuted})
	op := tel.spanNamed(t, "idem.Kind(9)")
	require.Equal(t, "postponed", spanAttrs(op)[idemotel.KeyOutcome].AsString())
	require.Equal(t, map[series]int64{
		{"Kind(9)", "postponed"}: 1,
		{"do", "postponed"}:      1,
		{"Kind(-1)", "executed"}: 1,
	}, tel.collect(t).counts(t))
}

func TestUnsampledOperation(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()); _ = tp.Shutdown(context.Background()) })
	tel := &telemetry{reader: reader, spans: spans, mp: mp, tp: tp, obs: idemotel.Observer(mp, tp)}

	ctx, caller := tel.caller(context.Background())
	require.False(t, caller.IsRecording())
	opCtx := tel.obs.Start(ctx, idem.KindDo)
	tel.obs.End(opCtx, idem.Event{Kind: idem.KindDo, Outcome: idem.OutcomeExecuted})
	require.False(t, caller.SpanContext().IsSampled())
	require.Equal(t, caller.SpanContext().TraceID(), trace.SpanContextFromContext(opCtx).TraceID(),
		"the trace goes on through the unsampled operation")
	caller.End()
	require.Empty(t, spans.Ended())
	require.Equal(t, map[series]int64{{"do", "executed"}: 1}, tel.collect(t).counts(t),
		"metrics do not depend on sampling")
}

// TestEndsOnlyItsOwnSpan: End given a context without the span Start opened
// (the core's contract is to pass Start's) records the metrics and ends
// nothing, never the caller's span.
func TestEndsOnlyItsOwnSpan(t *testing.T) {
	tel := newTelemetry(t)
	ctx, caller := tel.caller(context.Background())
	tel.obs.End(ctx, idem.Event{Kind: idem.KindDo, Outcome: idem.OutcomeExecuted})
	require.True(t, caller.IsRecording(), "the caller's span was ended")
	caller.End()
	require.Len(t, tel.spans.Ended(), 1)
	require.Equal(t, map[series]int64{{"do", "executed"}: 1}, tel.collect(t).counts(t))
}

func TestNoopProviders(t *testing.T) {
	o := idemotel.Observer(metricnoop.NewMeterProvider(), tracenoop.NewTracerProvider())
	ctx := o.Start(context.Background(), idem.KindHTTP)
	o.End(ctx, idem.Event{Kind: idem.KindHTTP, Outcome: idem.OutcomeStoreUnavailable, Err: errors.New("x")})
}

// TestNilProvidersAreGlobals sets the otel globals: it must not run in
// parallel with other tests.
func TestNilProvidersAreGlobals(t *testing.T) {
	prevMP, prevTP := otel.GetMeterProvider(), otel.GetTracerProvider()
	t.Cleanup(func() { otel.SetMeterProvider(prevMP); otel.SetTracerProvider(prevTP) })
	tel := newTelemetry(t)
	otel.SetMeterProvider(tel.mp)
	otel.SetTracerProvider(tel.tp)

	o := idemotel.Observer(nil, nil)
	ctx := o.Start(context.Background(), idem.KindOnce)
	o.End(ctx, idem.Event{Kind: idem.KindOnce, Outcome: idem.OutcomeMismatch, Fence: 2})
	tel.spanNamed(t, "idem.once")
	require.Equal(t, map[series]int64{{"once", "mismatch"}: 1}, tel.collect(t).counts(t))
}

func TestConcurrentOperations(t *testing.T) {
	tel := newTelemetry(t, idemotel.WithOperationID())
	const workers, each = 8, 50
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				o := allOutcomes[(w+i)%len(allOutcomes)]
				ctx := tel.obs.Start(context.Background(), idem.KindHTTP)
				tel.obs.End(ctx, idem.Event{Kind: idem.KindHTTP, Outcome: o, ID: "id", Wait: time.Millisecond})
			}
		})
	}
	wg.Wait()
	var total int64
	for _, n := range tel.collect(t).counts(t) {
		total += n
	}
	require.Equal(t, int64(workers*each), total)
	require.Len(t, tel.spansNamed("idem.http"), workers*each)
}

// TestEndMetricsDoNotAllocate: with precomputed attribute sets, recording an
// operation's metrics allocates nothing (the SDK's aggregation included).
var allocEvent = idem.Event{Kind: idem.KindDo, Outcome: idem.OutcomeReplayed, Fence: 1, ID: "id",
	Duration: 3 * time.Millisecond, Wait: time.Millisecond, Store: time.Millisecond}

func TestEndMetricsDoNotAllocate(t *testing.T) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	o := idemotel.Observer(mp, tracenoop.NewTracerProvider(), idemotel.WithOperationID())
	ctx := o.Start(context.Background(), idem.KindDo)
	o.End(ctx, allocEvent) // the first measurement of a series creates it
	require.Zero(t, testing.AllocsPerRun(100, func() { o.End(ctx, allocEvent) }))
}
