// Package idemotel records idem's operations as OpenTelemetry metrics and
// traces.
//
// Observer returns an idem.Observer; set it on the Guard:
//
//	g := idem.New(idem.NewRedisStore(rdb),
//		idem.WithObserver(idemotel.Observer(meterProvider, tracerProvider)))
//
// Every operation is recorded once: a call of idem.Do or Guard.Once, or a
// request Guard.Middleware protects. The claims a waiting duplicate repeats
// are part of its one operation, so the counts are not inflated by polling.
//
// # Metrics
//
// All four instruments carry the same two attributes, idem.kind and
// idem.outcome:
//
//	idem.operations          counter, int64, {operation}  operations that ended
//	idem.operation.duration  histogram, float64, s        the whole operation
//	idem.wait.duration       histogram, float64, s        time a duplicate waited (only operations that waited)
//	idem.store.duration      histogram, float64, s        time spent waiting for the store (claims, completion, release)
//
// Under the middleware, idem.operation.duration covers the whole request
// inside it, the handler and the refusals included. The histograms' bucket
// boundaries (an advice a View may override) run from 5 ms to 60 s, and from
// 0.5 ms to 5 s for the store.
//
// Exported to Prometheus (examples/prometheus shows the wiring), they are
// idem_operations_total, idem_operation_duration_seconds,
// idem_wait_duration_seconds and idem_store_duration_seconds, with the labels
// idem_kind and idem_outcome.
//
// idem.kind is "do" (idem.Do), "once" (Guard.Once) or "http"
// (Guard.Middleware). idem.outcome is one of the idem.Outcome values, each
// defined in the core's documentation:
//
//	executed           fn (or the handler) ran and its result was stored
//	replayed           the stored result of an earlier run was returned
//	in_progress        another attempt held the key (after waiting, if the operation waited)
//	mismatch           the key was used before with another request
//	invalid_key        the key was refused before a claim (under the middleware also missing or repeated)
//	too_large          the request body was larger than the middleware accepts
//	store_unavailable  the store failed or answered the claim too late
//	canceled           the caller's context ended before fn ran
//	lease_lost         the lease was lost while fn ran or at completion
//	not_recorded       fn ran but its result could not be stored
//	released           fn failed or panicked (or answered 5xx); the key is free again
//	unreadable         a stored result could not be read back
//
// An operation that ran fn is executed, lease_lost, not_recorded or released;
// the others did not run it. Alert on store_unavailable, lease_lost,
// not_recorded and unreadable: they are idem's failures, the others are
// answers.
//
// # Traces
//
// Each operation is a span named idem.do, idem.once or idem.http (kind
// Internal), opened before the claim as a child of the span in the caller's
// context (the server span of the request, under the middleware). The
// context it returns to the core is the one fn or the handler runs under, so
// the spans they open are children of the operation's span. The span ends
// with the operation and carries:
//
//	idem.kind      string  do, once or http (set at the start, for samplers)
//	idem.outcome   string  the outcome, as above
//	idem.fence     int     the record's fence: the attempt's own when fn ran, the stored record's on a replay or a mismatch, 0 when unknown
//	idem.replayed  bool    the stored result was returned (outcome replayed)
//	idem.id        string  the operation id, only with WithOperationID
//
// A span whose outcome is store_unavailable, lease_lost, not_recorded,
// recording or unreadable has status Error, with the caller's error recorded as an
// exception event. The other outcomes leave the status unset: a conflict or a
// mismatch is the client's, and fn's own error is for the spans fn opens and
// the caller's to record. The metrics do not depend on sampling: an
// operation whose span is not sampled is counted all the same.
//
// # Cardinality and privacy
//
// No attribute carries an idempotency key, a message id, a scope (tenant,
// account) or a request: keys are chosen by clients and may be personal, and
// one series per key would be unbounded. The metrics have at most 3 kinds ×
// 14 outcomes series each. WithOperationID adds to the spans (never to the
// metrics) the operation id that idem.OperationID computes and Inspect and
// Forget take: an operator who knows a key can find its spans. The id is an
// unsalted hash of the kind, scope and key, so it hides a random key (a
// UUID) but not a guessable one (an order number): a reader of the spans can
// confirm a guess. Leave the option off when keys are guessable and the
// spans leave your trust boundary.
package idemotel
