package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
)

// Do runs fn at most once for key, across every process sharing g's store,
// and returns its result to the first caller and to every repeat.
//
// req is the request the key stands for. It is encoded as canonical JSON and
// fingerprinted with SHA-256; a repeat of key with another fingerprint gets
// ErrMismatch, whatever the state of the first. Use a stable key per logical
// operation, created by the client when the intent is created.
//
// What a caller gets:
//   - First caller: fn runs with a lease on key, renewed while it runs.
//     Its value is stored as JSON (a []byte or string as is) and returned.
//   - Repeat after completion: the stored value, decoded into T from JSON;
//     fn does not run. The repeat gets what JSON carries: unexported fields
//     come back zero, numbers inside an any come back as float64, a
//     time.Time keeps its instant but not its monotonic reading. A []byte or
//     string (also inside Do[any]) comes back as it was.
//   - Concurrent duplicate: *InProgressError (ErrInProgress), or, with
//     WithWait, the first caller's result once stored.
//   - fn returns an error: the claim is released and the error returned; the
//     next call runs fn again, with Attempt.Fence one higher and the
//     checkpoints of this attempt. An error wrapped by Permanent is stored
//     instead, and every repeat gets an error with the same message that
//     satisfies errors.Is(err, ErrPermanent).
//   - fn panics, or calls runtime.Goexit (t.FailNow in a test): the claim is
//     released and the panic (or the Goexit) continues.
//   - The caller's context ends while fn runs: fn's context is cancelled
//     too, but the lease is held until fn returns and its result is still
//     stored (completion runs detached, bounded by WithWriteTimeout), so
//     that a retry finds it.
//   - The holder's lease is lost (it froze longer than the lease and another
//     attempt took over, or Redis did not answer a renewal before the lease
//     ran out): fn's context is cancelled with cause ErrLeaseLost, and its
//     result is not stored.
//   - The store fails before fn runs, or answers a claim too late to trust
//     its lease: ErrStoreUnavailable, fn not run. The store fails after fn
//     ran: fn's value with ErrNotRecorded joined with the cause; the claim
//     stays until its lease expires, and the next attempt sees Fence+1 and
//     the checkpoints. A completion that did not answer within the write
//     timeout may have been stored or not: a repeat tells.
//   - T is a type JSON can never encode (a chan, a func, a struct with
//     such a field): an error before the claim; fn does not run.
//
// In steady state a fresh key costs two round trips to the store (claim and
// complete) and a replay one.
func Do[T any](ctx context.Context, g *Guard, key string, req any, fn func(ctx context.Context, a *Attempt) (T, error)) (T, error) {
	var zero T
	if fn == nil {
		return zero, errors.New("idem: Do with a nil function")
	}
	if err := resultType(reflect.TypeFor[T]()); err != nil {
		return zero, err
	}
	fp, err := requestFingerprint(req)
	if err != nil {
		return zero, err
	}
	var (
		v    T
		ferr error
		res  T
	)
	rerr := g.exec(ctx, op{kind: KindDo, key: key, fp: fp, wait: g.defaultWait()}, func(ctx context.Context, a *Attempt) ([]byte, bool) {
		v, ferr = fn(ctx, a)
		var p []byte
		p, ferr = encodeResult(v, ferr)
		return p, p != nil
	}, func(out outcome, err error) (error, bool) {
		switch {
		case out.replayed:
			var derr error
			res, derr = decodeResult[T](out.payload)
			return derr, derr != nil && !errors.Is(derr, ErrPermanent)
		case out.ran:
			res = v
			return joinErrors(ferr, err), false
		}
		return err, false
	})
	return res, rerr
}

// encodeResult returns the payload to store for fn's value v and error
// ferr, or nil when nothing is to be stored (ferr is not Permanent): JSON
// with a tag, a []byte or string as is, a Permanent error's message. A value
// that turns out not to encode is stored as a Permanent error, which is
// returned in place of ferr.
func encodeResult(v any, ferr error) ([]byte, error) {
	switch {
	case ferr != nil && errors.Is(ferr, ErrPermanent):
		return encodeError(ferr), ferr
	case ferr != nil:
		return nil, ferr
	}
	switch raw := v.(type) {
	case []byte:
		return append([]byte{payloadBytes}, raw...), nil
	case string:
		return append([]byte{payloadString}, raw...), nil
	}
	e := jsonEncoders.get()
	defer e.done()
	e.buf.WriteByte(payloadValue)
	if err := e.enc.Encode(v); err != nil {
		perr := Permanent(fmt.Errorf("idem: result of type %T is not JSON-encodable: %w", v, err))
		return encodeError(perr), perr
	}
	b := e.buf.Bytes()
	return bytes.Clone(b[:len(b)-1]), nil // without Encode's newline
}

// Once runs fn at most once for the message id, for consumers of at-least-once
// deliveries. It reports ran=false, and does not call fn, when id was already
// processed.
//
// The id is marked processed only after fn returns nil. An error from fn
// releases the id, so a redelivery runs fn again, and Once returns (true, err);
// an error wrapped by Permanent is recorded instead, and a redelivery gets
// (false, err) with the same message. A concurrent redelivery waits as set by
// WithWait, else gets ErrInProgress. Once ids live in their own namespace,
// apart from Do keys, and follow the same rules as keys (ErrInvalidKey).
func (g *Guard) Once(ctx context.Context, id string, fn func(ctx context.Context) error) (ran bool, err error) {
	if fn == nil {
		return false, errors.New("idem: Once with a nil function")
	}
	var ferr error
	rerr := g.exec(ctx, op{kind: KindOnce, key: id, fp: onceFingerprint, wait: g.defaultWait()}, func(ctx context.Context, a *Attempt) ([]byte, bool) {
		ferr = fn(ctx)
		switch {
		case ferr == nil:
			return []byte{payloadValue}, true
		case errors.Is(ferr, ErrPermanent):
			return encodeError(ferr), true
		}
		return nil, false
	}, func(out outcome, err error) (error, bool) {
		ran = out.ran
		switch {
		case out.replayed && len(out.payload) > 0 && out.payload[0] == payloadError:
			return &permanentError{err: errors.New(string(out.payload[1:]))}, false
		case !out.replayed:
			return joinErrors(ferr, err), false
		}
		return nil, false
	})
	return ran, rerr
}

// Payload tags for results stored by Do and Once.
const (
	payloadValue  byte = 'v' // JSON
	payloadBytes  byte = 'b' // a []byte result, stored as is
	payloadString byte = 's' // a string result, stored as is
	payloadError  byte = 'e' // the message of a Permanent error
)

func encodeError(err error) []byte {
	return append([]byte{payloadError}, err.Error()...)
}

func decodeResult[T any](payload []byte) (T, error) {
	var v T
	if len(payload) == 0 {
		return v, errors.New("idem: stored result is empty")
	}
	switch payload[0] {
	case payloadError:
		return v, &permanentError{err: errors.New(string(payload[1:]))}
	case payloadBytes, payloadString:
		switch p := any(&v).(type) {
		case *[]byte:
			*p = payload[1:]
			return v, nil
		case *string:
			*p = string(payload[1:])
			return v, nil
		case *any: // Do[any]: the dynamic type fn returned
			if payload[0] == payloadString {
				*p = string(payload[1:])
			} else {
				*p = payload[1:]
			}
			return v, nil
		}
		return v, fmt.Errorf("idem: stored result is bytes and does not decode into %T", v)
	case payloadValue:
		if v, ok := decodeValue[T](payload[1:]); ok {
			return v, nil
		}
		return unmarshalResult[T](payload[1:])
	}
	return v, fmt.Errorf("idem: stored result has unknown tag %q", payload[0])
}

// unmarshalResult decodes a stored JSON result with json.Unmarshal: what
// decodeValue does not decode, and the error it gets.
func unmarshalResult[T any](data []byte) (T, error) {
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		return v, fmt.Errorf("idem: stored result does not decode into %T: %w", v, err)
	}
	return v, nil
}
