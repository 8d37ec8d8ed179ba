package idemlambda

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/idemkit/idem"
)

// Handler wraps a Lambda handler so that h runs once per key, across every
// instance sharing g's store, and every repeat of the event gets its first
// result. key makes the key of an event (a client's request id, an order id,
// an id a producer put in the event); the key is scoped by the function's
// name (WithScope). Give the result to lambda.Start:
//
//	lambda.Start(idemlambda.Handler(g, func(_ context.Context, o Order) (string, error) {
//		return o.RequestID, nil
//	}, charge))
//
// What an invocation gets:
//
//   - First event with a key: h runs with the invocation's context, which
//     carries the Attempt (idem.AttemptFrom) and a lease that ends a second
//     after the invocation's deadline (LeaseContext). Its result is stored
//     as JSON for the Guard's retention and returned.
//   - A repeat after it completed: the stored result, decoded into Out; h
//     does not run.
//   - A repeat while another instance runs h: the first result once stored
//     under the Guard's idem.WithWait, otherwise an error satisfying
//     errors.Is(err, idem.ErrInProgress), which Lambda reports as the
//     invocation's error (an asynchronous invocation is retried).
//   - The same key with another event (another fingerprint, WithFingerprint):
//     an error satisfying errors.Is(err, idem.ErrMismatch); h does not run.
//   - h returns an error: the key is released and the error returned, so
//     Lambda's retry runs h again, with Attempt.Fence one higher. An error
//     wrapped with idem.Permanent is stored instead, and every repeat gets
//     an error satisfying errors.Is(err, idem.ErrPermanent) with its message.
//   - h panics: the key is released and the panic continues (Lambda reports
//     it and restarts the instance).
//   - An instance killed at its timeout (or frozen) while h ran: its lease
//     ends a second after the deadline; the retry then runs h at once, with
//     Attempt.Fence one higher and the dead attempt's checkpoints.
//   - key returns an error or "": an error wrapping ErrNoKey; h does not run.
//     A key idem refuses (over 255 bytes with its scope, not printable
//     ASCII): idem.ErrInvalidKey.
//   - The store is unreachable: an error satisfying
//     errors.Is(err, idem.ErrStoreUnavailable); h does not run.
//   - h ran but its result could not be stored (idem.ErrNotRecorded, logged
//     by the Guard): h's result, without an error, as the HTTP middleware
//     answers with the handler's own response.
//
// The event is "the same" when its JSON is (canonical: member order does not
// matter), or when the JSON of WithFingerprint's value is.
//
// Handler panics on a nil Guard, key or h, or an option that does not
// apply, at construction.
func Handler[In, Out any](g *idem.Guard, key func(ctx context.Context, in In) (string, error),
	h func(ctx context.Context, in In) (Out, error), opts ...Option) func(ctx context.Context, in In) (Out, error) {
	switch {
	case g == nil:
		panic("idemlambda: Handler with a nil Guard")
	case key == nil:
		panic("idemlambda: Handler with a nil key function")
	case h == nil:
		panic("idemlambda: Handler with a nil handler")
	}
	c := newConfig("Handler", reflect.TypeFor[In](), opts)
	fp := fingerprintOf[In](c)
	return func(ctx context.Context, in In) (Out, error) {
		var zero Out
		ctx = LeaseContext(ctx)
		k, err := key(ctx, in)
		switch {
		case err != nil:
			return zero, fmt.Errorf("%w: %w", ErrNoKey, err)
		case k == "":
			return zero, fmt.Errorf("%w: the key function returned none", ErrNoKey)
		}
		req, err := request(fp, in)
		if err != nil {
			return zero, err
		}
		var herr error
		ran := false
		out, err := idem.Do(ctx, g, c.key(k), req, func(ctx context.Context, a *idem.Attempt) (Out, error) {
			ran = true
			var out Out
			out, herr = h(idem.ContextWithAttempt(ctx, a), in)
			return out, herr
		})
		switch {
		case err == nil:
			return out, nil
		case ran && herr == nil && errors.Is(err, idem.ErrNotRecorded):
			return out, nil // logged by the Guard: the answer h made
		case ran || errors.Is(err, idem.ErrPermanent):
			return zero, err // h's error, or its stored Permanent error: the same message
		}
		return zero, fmt.Errorf("idemlambda: key %q: %w", k, err)
	}
}
