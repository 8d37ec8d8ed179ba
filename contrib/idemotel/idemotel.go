package idemotel

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
)

// ScopeName is the instrumentation scope of the meter and the tracer
// Observer creates.
const ScopeName = "github.com/idemkit/idem/contrib/idemotel"

// Attribute keys set on the metrics and the spans.
const (
	KeyKind     = attribute.Key("idem.kind")     // "do", "once" or "http" (idem.Kind.String)
	KeyOutcome  = attribute.Key("idem.outcome")  // an idem.Outcome
	KeyFence    = attribute.Key("idem.fence")    // the record's fence (spans only)
	KeyReplayed = attribute.Key("idem.replayed") // the stored result was returned (spans only)
	KeyID       = attribute.Key("idem.id")       // the operation id, with WithOperationID (spans only)
)

// Option configures Observer.
type Option func(*config)

type config struct {
	operationID bool
}

// WithOperationID adds the attribute idem.id, the operation's id
// (idem.Event.ID: a hash of its kind, scope and key, never the key itself),
// to the spans, so that a span can be found from the id Inspect and Forget
// take, and the attempts of one key can be told apart from others. The
// metrics never carry it: one series per key would be unbounded. By default
// spans carry no id.
func WithOperationID() Option {
	return func(c *config) { c.operationID = true }
}

// Observer returns an idem.Observer that records every operation of a Guard
// as metrics of mp and a span of tp; pass it to idem.WithObserver. A nil mp
// or tp stands for the global provider (otel.GetMeterProvider,
// otel.GetTracerProvider), looked up once, here. The package documentation
// lists the metrics, the attributes and the span.
//
// The Observer is safe for concurrent use. Its instruments are created once,
// here; an error creating one (which the SDK reports only for invalid names,
// not ours) is sent to otel.Handle and the instrument is replaced by a no-op.
func Observer(mp metric.MeterProvider, tp trace.TracerProvider, opts ...Option) idem.Observer {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	meter := mp.Meter(ScopeName)
	o := &observer{
		tracer:      tp.Tracer(ScopeName),
		operationID: c.operationID,
		ops:         counter(meter, "idem.operations", "{operation}", "Operations run by idem, by kind and outcome."),
		duration: histogram(meter, "idem.operation.duration",
			"Duration of idem operations: the call of Do or Once, or the request inside the middleware.", durationBuckets),
		wait: histogram(meter, "idem.wait.duration",
			"Time a duplicate spent waiting for the first attempt, for the operations that waited.", durationBuckets),
		store: histogram(meter, "idem.store.duration",
			"Time an operation spent waiting for the store: claims, completion and release.", storeBuckets),
		attrs: make(map[opKey]*opAttrs, len(kinds)*len(outcomes)),
	}
	for _, k := range kinds {
		o.start[k] = startOpts(k)
		for _, out := range outcomes {
			o.attrs[opKey{k, out}] = newOpAttrs(k, out)
		}
	}
	return o
}

// Bucket boundaries, in seconds: those of OpenTelemetry's HTTP duration
// metrics, with longer ones for waits and leases measured in tens of seconds.
var (
	durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30, 60}
	storeBuckets    = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}
)

var (
	kinds    = []idem.Kind{idem.KindDo, idem.KindOnce, idem.KindHTTP}
	outcomes = []idem.Outcome{
		idem.OutcomeExecuted, idem.OutcomeReplayed, idem.OutcomeInProgress, idem.OutcomeMismatch,
		idem.OutcomeInvalidKey, idem.OutcomeTooLarge, idem.OutcomeStoreUnavailable, idem.OutcomeCanceled,
		idem.OutcomeLeaseLost, idem.OutcomeNotRecorded, idem.OutcomeRecording, idem.OutcomeReleased, idem.OutcomeAbandoned,
		idem.OutcomeUnreadable,
	}
)

// failed reports whether an outcome is a failure of idem or its store, as
// opposed to an answer (a replay, a conflict, a refused key) or fn's own
// error: the span's status is then Error.
func failed(o idem.Outcome) bool {
	switch o {
	case idem.OutcomeStoreUnavailable, idem.OutcomeLeaseLost, idem.OutcomeNotRecorded, idem.OutcomeRecording, idem.OutcomeUnreadable:
		return true
	}
	return false
}

type observer struct {
	tracer      trace.Tracer
	operationID bool

	ops      metric.Int64Counter
	duration metric.Float64Histogram
	wait     metric.Float64Histogram
	store    metric.Float64Histogram

	start [idem.KindHTTP + 1]*kindStart // by kind; nil for an unknown kind
	attrs map[opKey]*opAttrs            // read only after Observer
}

type opKey struct {
	kind    idem.Kind
	outcome idem.Outcome
}

// kindStart is what Start passes for a kind, computed once.
type kindStart struct {
	name string
	opts []trace.SpanStartOption
}

func startOpts(k idem.Kind) *kindStart {
	return &kindStart{
		name: "idem." + k.String(),
		opts: []trace.SpanStartOption{
			trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(KeyKind.String(k.String())),
		},
	}
}

// opAttrs is what End records for a kind and an outcome, computed once.
type opAttrs struct {
	add     []metric.AddOption
	record  []metric.RecordOption
	outcome attribute.KeyValue
}

func newOpAttrs(k idem.Kind, o idem.Outcome) *opAttrs {
	set := metric.WithAttributeSet(attribute.NewSet(KeyKind.String(k.String()), KeyOutcome.String(string(o))))
	return &opAttrs{
		add:     []metric.AddOption{set},
		record:  []metric.RecordOption{set},
		outcome: KeyOutcome.String(string(o)),
	}
}

// spanKey is the context key of the span Start opened, so that End ends that
// span and never another found in the context.
type spanKey struct{}

// Start opens the operation's span, a child of the span in ctx, and returns
// a context carrying it: the spans fn or the handler opens are its children.
func (o *observer) Start(ctx context.Context, kind idem.Kind) context.Context {
	ks := o.kindStart(kind)
	ctx, span := o.tracer.Start(ctx, ks.name, ks.opts...)
	if !span.IsRecording() {
		return ctx // nothing to end: a no-op or unsampled span
	}
	return context.WithValue(ctx, spanKey{}, span)
}

// End records the operation's metrics and ends its span.
func (o *observer) End(ctx context.Context, e idem.Event) {
	a := o.opAttrs(e.Kind, e.Outcome)
	o.ops.Add(ctx, 1, a.add...)
	o.duration.Record(ctx, e.Duration.Seconds(), a.record...)
	if e.Wait > 0 {
		o.wait.Record(ctx, e.Wait.Seconds(), a.record...)
	}
	if e.Store > 0 {
		o.store.Record(ctx, e.Store.Seconds(), a.record...)
	}

	span, ok := ctx.Value(spanKey{}).(trace.Span)
	if !ok {
		return
	}
	if o.operationID && e.ID != "" {
		span.SetAttributes(a.outcome, KeyFence.Int64(e.Fence),
			KeyReplayed.Bool(e.Outcome == idem.OutcomeReplayed), KeyID.String(e.ID))
	} else {
		span.SetAttributes(a.outcome, KeyFence.Int64(e.Fence),
			KeyReplayed.Bool(e.Outcome == idem.OutcomeReplayed))
	}
	if failed(e.Outcome) {
		desc := string(e.Outcome)
		if e.Err != nil {
			span.RecordError(e.Err)
			desc = e.Err.Error()
		}
		span.SetStatus(codes.Error, desc)
	}
	span.End()
}

func (o *observer) kindStart(k idem.Kind) *kindStart {
	if k >= 0 && int(k) < len(o.start) && o.start[k] != nil {
		return o.start[k]
	}
	return startOpts(k) // a kind newer than this package
}

func (o *observer) opAttrs(k idem.Kind, out idem.Outcome) *opAttrs {
	if a, ok := o.attrs[opKey{k, out}]; ok {
		return a
	}
	return newOpAttrs(k, out) // a kind or an outcome newer than this package
}

func counter(m metric.Meter, name, unit, desc string) metric.Int64Counter {
	c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	if err != nil {
		otel.Handle(err)
		return metricnoop.Int64Counter{}
	}
	return c
}

func histogram(m metric.Meter, name, desc string, buckets []float64) metric.Float64Histogram {
	h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
		metric.WithExplicitBucketBoundaries(buckets...))
	if err != nil {
		otel.Handle(err)
		return metricnoop.Float64Histogram{}
	}
	return h
}
