package idem

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"time"
)

// Errors returned by the library. Test for them with errors.Is.
var (
	// ErrInProgress reports that another attempt holds a live lease on the key.
	// The error is an *InProgressError carrying the lease's remaining time.
	ErrInProgress = errors.New("idem: operation in progress")

	// ErrMismatch reports that the key was first used with a different request.
	ErrMismatch = errors.New("idem: key reused with a different request")

	// ErrLeaseLost reports that the caller no longer owns the key: its lease
	// expired and another attempt took the key over.
	ErrLeaseLost = errors.New("idem: lease lost")

	// ErrInvalidKey reports a key (or Once id) that is empty, longer than 255
	// bytes, or not printable ASCII.
	ErrInvalidKey = errors.New("idem: invalid key")

	// ErrStoreUnavailable reports that the store could not be reached. Unless it
	// is joined with ErrNotRecorded, the function was not run.
	ErrStoreUnavailable = errors.New("idem: store unavailable")

	// ErrNotRecorded reports that the function ran but its result could not be
	// stored. It is joined with ErrLeaseLost or ErrStoreUnavailable, and the
	// function's value is returned alongside it.
	ErrNotRecorded = errors.New("idem: result not recorded")

	// ErrPermanent marks an error made by Permanent, both when the function
	// returns it and when a repeat replays it.
	ErrPermanent = errors.New("idem: permanent error")
)

// InProgressError is the error returned while another attempt holds a live
// lease on the key. It matches ErrInProgress under errors.Is.
type InProgressError struct {
	// RetryAfter is the remaining time of the holder's lease: the earliest
	// moment a retry could take the key over.
	RetryAfter time.Duration
}

// Error implements error.
func (e *InProgressError) Error() string {
	return fmt.Sprintf("idem: operation in progress, retry after %v", e.RetryAfter)
}

// Is reports whether target is ErrInProgress.
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// Permanent marks err as the final outcome of an operation: Do and Once store
// it like a result, and every repeat of the key gets an error with the same
// message instead of running the function again. Both err's wrapper and its
// replay satisfy errors.Is(e, ErrPermanent). Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string        { return e.err.Error() }
func (e *permanentError) Unwrap() error        { return e.err }
func (e *permanentError) Is(target error) bool { return target == ErrPermanent }

const (
	defaultLease        = 30 * time.Second
	defaultRetention    = 24 * time.Hour
	minLease            = 30 * time.Millisecond
	maxKeyLen           = 255
	defaultWriteTimeout = 5 * time.Second
	minWriteTimeout     = 10 * time.Millisecond
)

// Guard runs operations at most once per key. It is safe for concurrent use
// by many goroutines, and any number of Guards in any number of processes may
// share one store.
//
// A Guard is configured once by New; it holds no connections or goroutines
// of its own.
type Guard struct {
	store     Store
	lease     time.Duration
	retention time.Duration
	wait      time.Duration
	write     time.Duration // bound of complete and release
	log       *slog.Logger
	nilStore  string // names the nil Store New was given
}

// Option configures a Guard.
type Option func(*Guard)

// WithLease sets the lease: how long a claim stays exclusive without a
// heartbeat. While the function runs, the lease is renewed every lease/3, so
// the lease bounds how long a crashed holder blocks the key, not how long the
// function may run. Values below 30ms are raised to 30ms; zero or negative
// means the default, 30s.
func WithLease(d time.Duration) Option {
	return func(g *Guard) {
		if d > 0 {
			g.lease = max(d, minLease)
		}
	}
}

// WithRetention sets how long a completed result is kept and replayed. Choose
// it longer than the longest realistic retry window of your clients; a key
// that returns after its record expired runs again. Zero or negative means the
// default, 24h.
func WithRetention(d time.Duration) Option {
	return func(g *Guard) {
		if d > 0 {
			g.retention = d
		}
	}
}

// WithWait sets how long a concurrent duplicate waits for the first attempt's
// result before it gets ErrInProgress. A waiter polls the store at most about
// 20 times a second, learns of completion within 50ms, takes the key over
// itself if the holder's lease expires meanwhile, and stops when its context
// ends. The default, 0, returns ErrInProgress at once.
func WithWait(d time.Duration) Option {
	return func(g *Guard) { g.wait = max(d, 0) }
}

// WithWriteTimeout bounds the store calls made after fn returned: the
// completion that stores its result and the release after a failure. They
// run detached from the caller's context, so that a caller giving up cannot
// void a result, and they are bounded by this timeout even when the Redis
// client would wait longer (go-redis ignores context deadlines unless its
// ContextTimeoutEnabled is set). A completion not answered in time is
// reported as ErrNotRecorded joined with ErrStoreUnavailable: it may or may
// not have been stored. Values below 10ms are raised to 10ms; zero or
// negative means the default, 5s.
func WithWriteTimeout(d time.Duration) Option {
	return func(g *Guard) {
		if d > 0 {
			g.write = max(d, minWriteTimeout)
		}
	}
}

// WithLogger sets the logger for events the caller cannot see in a return
// value: failed releases, heartbeat trouble, results that could not be
// recorded. The default is slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(g *Guard) {
		if l != nil {
			g.log = l
		}
	}
}

// defaultWait returns the wait set by WithWait; a nil Guard has none.
func (g *Guard) defaultWait() time.Duration {
	if g == nil {
		return 0
	}
	return g.wait
}

// New returns a Guard over store. It does no I/O. A nil store, or a nil
// pointer of a Store type, makes every operation fail with
// ErrStoreUnavailable.
func New(store Store, opts ...Option) *Guard {
	g := &Guard{
		store:     store,
		lease:     defaultLease,
		retention: defaultRetention,
		write:     defaultWriteTimeout,
		log:       slog.Default(),
	}
	if nilStore(store) {
		g.store, g.nilStore = nil, fmt.Sprintf(" (New got a nil %T)", store)
	}
	for _, o := range opts {
		if o != nil {
			o(g)
		}
	}
	return g
}

// nilStore reports whether s is nil or a nil pointer, map, func, channel or
// slice of a type implementing Store, whose methods would panic.
func nilStore(s Store) bool {
	if s == nil {
		return false // New(nil): no store, said as it is
	}
	switch v := reflect.ValueOf(s); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Slice, reflect.Interface:
		return v.IsNil()
	}
	return false
}

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
		ran  bool
	)
	payload, replayed, err := g.exec(ctx, op{ns: nsDo, key: key, fp: fp, wait: g.defaultWait()}, func(ctx context.Context, a *Attempt) ([]byte, bool, error) {
		ran = true
		v, ferr = fn(ctx, a)
		if ferr != nil {
			if errors.Is(ferr, ErrPermanent) {
				return encodeError(ferr), true, nil
			}
			return nil, false, ferr
		}
		switch raw := any(v).(type) {
		case []byte:
			return append([]byte{payloadBytes}, raw...), true, nil
		case string:
			return append([]byte{payloadString}, raw...), true, nil
		}
		b, merr := json.Marshal(v)
		if merr != nil {
			ferr = Permanent(fmt.Errorf("idem: result of type %T is not JSON-encodable: %w", v, merr))
			return encodeError(ferr), true, nil
		}
		return append([]byte{payloadValue}, b...), true, nil
	})
	switch {
	case replayed:
		return decodeResult[T](payload)
	case !ran:
		return zero, err
	case ferr != nil && err != nil && err != ferr:
		return v, errors.Join(ferr, err)
	case ferr != nil:
		return v, ferr
	}
	return v, err
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
	payload, replayed, err := g.exec(ctx, op{ns: nsOnce, key: id, fp: onceFingerprint, wait: g.defaultWait()}, func(ctx context.Context, a *Attempt) ([]byte, bool, error) {
		ran = true
		ferr = fn(ctx)
		switch {
		case ferr == nil:
			return []byte{payloadValue}, true, nil
		case errors.Is(ferr, ErrPermanent):
			return encodeError(ferr), true, nil
		}
		return nil, false, ferr
	})
	switch {
	case replayed:
		if len(payload) > 0 && payload[0] == payloadError {
			return false, &permanentError{err: errors.New(string(payload[1:]))}
		}
		return false, nil
	case ferr != nil && err != nil && err != ferr:
		return true, errors.Join(ferr, err)
	case ferr != nil:
		return true, ferr
	}
	return ran, err
}

// Namespaces keep Do keys, Once ids and HTTP keys apart.
const (
	nsDo   byte = 'd'
	nsOnce byte = 'o'
	nsHTTP byte = 'h'
)

// Payload tags for results stored by Do and Once.
const (
	payloadValue  byte = 'v' // JSON
	payloadBytes  byte = 'b' // a []byte result, stored as is
	payloadString byte = 's' // a string result, stored as is
	payloadError  byte = 'e' // the message of a Permanent error
)

// onceFingerprint is the fingerprint of every Once id: a message id stands
// for one message.
var onceFingerprint = fingerprint(nil)

// op names one logical operation: a key in a namespace and a scope, and the
// fingerprint of the request it stands for.
type op struct {
	ns    byte
	scope string
	key   string
	fp    string
	// detach runs fn on a context without the caller's cancellation: the
	// claim and any wait still end with the caller's context, fn does not.
	detach bool
	// wait is how long a duplicate waits for the holder's result (WithWait).
	wait time.Duration
}

// id returns the operation's stable, opaque id: the first 128 bits of the
// SHA-256 of its namespace, scope and key, base64url encoded (22 characters).
// Hashing keeps any key out of another's key space and gives every Redis key
// of the operation one hash tag.
func (o op) id() string {
	var buf [128]byte
	b := append(buf[:0], o.ns)
	b = binary.BigEndian.AppendUint64(b, uint64(len(o.scope)))
	b = append(b, o.scope...)
	b = append(b, o.key...)
	sum := sha256.Sum256(b)
	return base64.RawURLEncoding.EncodeToString(sum[:16])
}

// validKey reports why key is not a valid idempotency key, wrapping
// ErrInvalidKey, or nil when it is valid.
func validKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > maxKeyLen:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidKey, len(key), maxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: byte %#x at %d is not printable ASCII", ErrInvalidKey, c, i)
		}
	}
	return nil
}

// fingerprint returns the first 128 bits of the SHA-256 of b, base64url encoded.
func fingerprint(b []byte) string {
	sum := sha256.Sum256(b)
	return base64.RawURLEncoding.EncodeToString(sum[:16])
}

// requestFingerprint fingerprints req's canonical JSON: object keys sorted,
// no insignificant whitespace, numbers as encoded.
func requestFingerprint(req any) (string, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return "", fmt.Errorf("idem: request is not JSON-encodable: %w", err)
	}
	if len(b) > 0 && (b[0] == '{' || b[0] == '[') {
		// Structs marshal in field order, maps in key order: canonicalise
		// so that equal JSON documents fingerprint equally, also across a
		// deploy that reorders a struct's fields.
		if c, ok := canonicalJSON(make([]byte, 0, len(b)), b); ok {
			b = c
		}
	}
	return fingerprint(b), nil
}

// newToken returns a fresh owner token: 48 random bits, base64url encoded.
// It only needs to differ between the claims of one key while its record
// lives, and it is kept in every record.
func newToken() string {
	var b [6]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

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
		if err := json.Unmarshal(payload[1:], &v); err != nil {
			return v, fmt.Errorf("idem: stored result does not decode into %T: %w", v, err)
		}
		return v, nil
	}
	return v, fmt.Errorf("idem: stored result has unknown tag %q", payload[0])
}

// exec is the engine under Do, Once and the HTTP middleware. It validates the
// key, claims the operation (waiting per WithWait while another attempt holds
// it) and returns a stored payload as replayed without running fn. Otherwise
// it runs fn under a renewed lease; fn returns the payload to store and
// whether to keep it:
//
//   - err != nil: the claim is released and err returned.
//   - keep false: the claim is released and the payload returned.
//   - keep true: the payload is stored (compare-and-complete on a context
//     detached from ctx); on failure the payload is returned with
//     ErrNotRecorded joined with the cause.
//
// A panic in fn releases the claim and continues.
func (g *Guard) exec(ctx context.Context, o op, fn func(ctx context.Context, a *Attempt) (payload []byte, keep bool, err error)) (payload []byte, replayed bool, err error) {
	if g == nil || g.store == nil {
		var why string
		if g != nil {
			why = g.nilStore
		}
		return nil, false, fmt.Errorf("%w: the Guard has no store%s", ErrStoreUnavailable, why)
	}
	if err := validKey(o.key); err != nil {
		return nil, false, err
	}
	id := o.id()
	owner := newToken()
	req := ClaimRequest{Owner: owner, Fingerprint: o.fp, Lease: g.lease, TTL: g.lease + g.retention}
	var deadline time.Time
	if o.wait > 0 {
		deadline = time.Now().Add(o.wait)
	}
	for poll := 0; ; poll++ {
		sent := time.Now()
		res, err := g.store.Claim(ctx, id, req)
		if err != nil {
			return nil, false, g.storeError(ctx, err)
		}
		switch res.Status {
		case ClaimCompleted:
			return res.Payload, true, nil
		case ClaimMismatch:
			return nil, false, ErrMismatch
		case ClaimOK:
			rctx := ctx
			if o.detach {
				rctx = context.WithoutCancel(ctx)
			}
			payload, err := g.run(rctx, o.key, id, owner, sent, res, fn)
			return payload, false, err
		case ClaimBusy:
			if !sent.Before(deadline) {
				return nil, false, &InProgressError{RetryAfter: res.RetryAfter}
			}
			// Poll after 25ms, then every 50ms: about 20 polls a second, and
			// never later than the holder's lease or the wait allow.
			d := 50 * time.Millisecond
			if poll == 0 {
				d = 25 * time.Millisecond
			}
			d = min(d, max(res.RetryAfter, time.Millisecond), max(time.Until(deadline), 0))
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, false, fmt.Errorf("idem: waiting for the first attempt: %w", context.Cause(ctx))
			case <-t.C:
			}
		default:
			return nil, false, fmt.Errorf("%w: claim returned unknown status %d", ErrStoreUnavailable, res.Status)
		}
	}
}

// run runs fn as the owner of a fresh claim, sent at claimed.
func (g *Guard) run(ctx context.Context, key, id, owner string, claimed time.Time, res ClaimResult, fn func(ctx context.Context, a *Attempt) ([]byte, bool, error)) (payload []byte, err error) {
	claimed, err = g.confirmLease(ctx, id, owner, claimed)
	if err != nil {
		return nil, err
	}
	a := &Attempt{Key: key, ID: id, Fence: res.Fence, store: g.store, owner: owner, cps: res.Checkpoints}
	hctx, stop := g.holdLease(ctx, id, owner, claimed)
	var keep bool
	finished := false
	defer func() {
		if !finished { // fn panicked or called runtime.Goexit
			stop()
			g.release(ctx, id, owner)
		}
	}()
	payload, keep, err = fn(hctx, a)
	finished = true
	stop()
	if err != nil || !keep {
		g.release(ctx, id, owner)
		return payload, err
	}
	cerr := g.bounded(ctx, func(ctx context.Context) error {
		return g.store.Complete(ctx, id, owner, payload, g.retention)
	})
	if cerr != nil {
		if !errors.Is(cerr, ErrLeaseLost) {
			cerr = fmt.Errorf("%w: %w", ErrStoreUnavailable, cerr)
		}
		g.log.ErrorContext(ctx, "idem: result not recorded", "key", key, "id", id, "fence", res.Fence, "err", cerr)
		return payload, errors.Join(ErrNotRecorded, cerr)
	}
	return payload, nil
}

// release gives up a claim so that the next attempt runs again. Failures are
// logged: the claim then lasts until its lease expires.
func (g *Guard) release(ctx context.Context, id, owner string) {
	err := g.bounded(ctx, func(ctx context.Context) error { return g.store.Release(ctx, id, owner) })
	if err != nil && !errors.Is(err, ErrLeaseLost) {
		g.log.WarnContext(ctx, "idem: release failed; the key stays claimed until its lease expires", "id", id, "err", err)
	}
}

// errWriteTimeout reports a store write that did not answer within the
// Guard's write timeout.
var errWriteTimeout = errors.New("idem: the store did not answer within the write timeout")

// bounded runs a store write detached from ctx's cancellation and waits for
// it at most the write timeout (WithWriteTimeout). The call gets a context
// with that deadline, but a Redis client may ignore it (go-redis does unless
// ContextTimeoutEnabled is set): then the call is left to finish on its own,
// within the client's own timeouts, and bounded reports errWriteTimeout.
func (g *Guard) bounded(ctx context.Context, f func(ctx context.Context) error) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.write)
	done := make(chan error, 1)
	go func() {
		defer cancel()
		done <- f(wctx)
	}()
	select {
	case err := <-done:
		return err
	case <-wctx.Done():
		select {
		case err := <-done: // answered at the deadline
			return err
		default:
			return errWriteTimeout
		}
	}
}

// storeError wraps a store failure as ErrStoreUnavailable, unless it was the
// caller's own context that ended.
func (g *Guard) storeError(ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("idem: %w", context.Cause(ctx))
	case errors.Is(err, ErrStoreUnavailable):
		return err
	}
	return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
}
