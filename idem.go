package idem

import (
	"fmt"
	"log/slog"
	"reflect"
	"time"

	"github.com/idemkit/idem/idemstore"
)

const (
	defaultLease        = 30 * time.Second
	defaultRetention    = 24 * time.Hour
	minLease            = 30 * time.Millisecond
	defaultWriteTimeout = 5 * time.Second
	minWriteTimeout     = 10 * time.Millisecond
	defaultStoreTimeout = time.Second
	minStoreTimeout     = 10 * time.Millisecond
)

// storeTimeoutDefault is the store timeout of a Guard without
// WithStoreTimeout: defaultStoreTimeout, except in this package's own tests
// (export_test.go).
var storeTimeoutDefault = defaultStoreTimeout

// Guard runs operations at most once per key. It is safe for concurrent use
// by many goroutines, and any number of Guards in any number of processes may
// share one store.
//
// A Guard is configured once by New; it holds no connections or goroutines
// of its own.
type Guard struct {
	store     idemstore.Store
	lease     time.Duration
	retention time.Duration
	wait      time.Duration
	write     time.Duration // bound of complete and release
	budget    time.Duration // bound of every store call on a request's path
	// inlineWrites: the store returns by its context's deadline, so bounded
	// needs no goroutine of its own.
	inlineWrites bool
	// writeSet: WithWriteTimeout was given; a completion then waits write,
	// not the budget.
	writeSet   bool
	health     *storeHealth // fail-fast, the store's own when it keeps one
	pending    backlog      // background writes, for Drain
	takingBack takeBacks    // take-backs going on in the background, by id
	log        *slog.Logger
	observer   Observer
	sealer     Sealer // WithSealer; New puts a sealedStore in front of store
	sealerSet  bool   // WithSealer was given, perhaps a nil Sealer
	// fingerprintKeyIDs are the ids of the Sealer's fingerprint keys, the
	// current one first; none without a FingerprintKeyer.
	fingerprintKeyIDs []string
	unusable          string // why the Guard has no store to use: a nil Store or Sealer
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
// result before it gets ErrInProgress. A waiter on a store that notifies
// (RedisStore, on Redis 7 with sharded Pub/Sub) is woken when the result is
// stored or the key released, and checks on its own only every 2s and when
// the holder's lease runs out; on other stores it polls, about 20 times a
// second. It takes the key over itself if the holder's lease expires
// meanwhile, and stops when its context ends. The default, 0, returns
// ErrInProgress at once.
func WithWait(d time.Duration) Option {
	return func(g *Guard) { g.wait = max(d, 0) }
}

// WithWriteTimeout sets how long the caller waits for the store writes made
// after fn returned: the completion that stores its result and the release
// after a failure. The default is the store timeout (WithStoreTimeout). They
// run detached from the caller's context, so that a caller giving up cannot
// void a result. A write not answered in time goes on in the background
// (see Drain) and the caller gets fn's result with ErrNotRecorded joined
// with ErrStoreUnavailable: a repeat then tells whether it was stored.
// Values below 10ms are raised to 10ms; zero or negative means the default.
func WithWriteTimeout(d time.Duration) Option {
	return func(g *Guard) {
		if d > 0 {
			g.write, g.writeSet = max(d, minWriteTimeout), true
		}
	}
}

// WithStoreTimeout sets the store budget: how long an operation waits for
// any one store call on its path (the claim, which also reads a replay, the
// subscription of a waiting duplicate, a lease renewal, a checkpoint, the
// completion, a release), whatever the Redis client's own timeouts and
// retries. The default is 1s. Values below 10ms are raised to 10ms; zero or
// negative means the default.
//
// What a store that does not answer in time costs:
//   - A claim: ErrStoreUnavailable (the middleware: 503 with Retry-After),
//     fn not run. The claim may still reach the store later (a frozen
//     server runs it when it wakes): its owner takes it back in the
//     background as soon as the store answers, so the retry that the
//     refusal invited runs at once, with the Fence it would have had.
//   - The completion: the caller gets fn's result with ErrNotRecorded (the
//     middleware sends the handler's response); the completion goes on in
//     the background until it is stored or the lease ends (Drain waits for
//     it), so a repeat finds the result once the store answers.
//   - A release after a failure goes on in the background alike.
//   - Fail fast: when calls keep failing (three in a row, or none answered
//     for a whole budget), new operations are refused at once with
//     ErrStoreUnavailable instead of each waiting the budget; every 100ms
//     one call goes through as a probe, and the first answer ends it
//     (StoreState, StoreStateObserver).
func WithStoreTimeout(d time.Duration) Option {
	return func(g *Guard) {
		if d > 0 {
			g.budget = max(d, minStoreTimeout)
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

// WithObserver sets an Observer, told of every operation's start and end.
// A nil Observer is ignored.
func WithObserver(o Observer) Option {
	return func(g *Guard) {
		if o != nil {
			g.observer = o
		}
	}
}

// WithSealer seals what the Guard stores with s (see Sealer; use
// NewAESGCMSealer): Do and Once results, Permanent errors, HTTP responses and
// checkpoint values. Each is bound to its operation's id and slot: a
// result or response to id+"\x00result", a checkpoint to
// id+"\x00cp\x00"+name. A value that does not open makes the operation fail
// with ErrUnreadable (the middleware: 500), and its function is not run;
// the Guard logs it at error level with the value's key id, never key
// material. The default is no sealing. A nil Sealer (say, the result of a
// NewAESGCMSealer whose error was ignored) makes every operation fail with
// ErrStoreUnavailable: nothing is stored unsealed by mistake.
//
// With a Sealer that implements idemstore.FingerprintKeyer (NewAESGCMSealer's does),
// the stored request fingerprint is keyed too: its secret is derived from
// the current sealing key (HMAC-SHA-256(key, "idem fingerprint v1")), and a
// record keyed with any other listed key is still recognised, so a retry
// after a rotation replays and a changed request still gets ErrMismatch.
// With any other Sealer the fingerprint stays the plain SHA-256 of the
// request, which whoever reads the store can check a guessed request
// against.
//
// What stays in the clear: the record's state, fence, owner token and
// creation time, checkpoint names, key ids, TTLs, and the Redis key names
// (which hold the operation's id, a hash of its scope and key).
//
// Turning sealing on, or off, on a store that holds records makes those
// records unreadable to the Guards of the other kind until they expire: their
// operations get ErrUnreadable. Switch when the store is empty (a new
// prefix, WithPrefix) or accept that for one retention.
func WithSealer(s Sealer) Option {
	return func(g *Guard) { g.sealer, g.sealerSet = s, true }
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
func New(store idemstore.Store, opts ...Option) *Guard {
	g := &Guard{
		store:     store,
		lease:     defaultLease,
		retention: defaultRetention,
		write:     defaultWriteTimeout,
		budget:    storeTimeoutDefault,
		log:       slog.Default(),
	}
	g.unusable = "the Guard has no store"
	if isNil(store) {
		g.store, g.unusable = nil, fmt.Sprintf("the Guard has no store (New got a nil %T)", store)
	}
	for _, o := range opts {
		if o != nil {
			o(g)
		}
	}
	switch {
	case g.sealerSet && (g.sealer == nil || isNil(g.sealer)):
		// Storing in the clear what was meant to be sealed would turn the
		// protection off unseen: refuse every operation instead.
		g.store, g.unusable = nil, fmt.Sprintf("WithSealer got a nil Sealer (%T); nothing is stored unsealed", g.sealer)
		g.log.Error("idem: "+g.unusable+"; every operation fails with ErrStoreUnavailable", "event", "sealer_missing")
	case g.sealer != nil && g.store != nil:
		ss := newSealedStore(g.store, g.sealer, g.log, defaultWriteTimeout)
		g.store, g.fingerprintKeyIDs = ss, ss.keyIDs()
	}
	if d, ok := g.store.(idemstore.DeadlineAware); ok {
		g.inlineWrites = d.ReturnsByDeadline()
	}
	if hs, ok := g.store.(healthStore); ok && hs.storeHealth() != nil {
		g.health = hs.storeHealth()
	} else {
		g.health = newStoreHealth()
		g.health.log = g.log
	}
	if !g.writeSet {
		g.write = g.budget
	}
	g.watchStoreState(g.observer)
	return g
}

// isNil reports whether v is a nil pointer, map, func, channel or slice in
// an interface, whose methods would panic; false for a nil interface.
func isNil(v any) bool {
	if v == nil {
		return false // New(nil): no store, said as it is
	}
	switch v := reflect.ValueOf(v); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Slice, reflect.Interface:
		return v.IsNil()
	}
	return false
}

// StoreState returns the state of the Guard's store: StoreFailing while
// new operations are refused at once because its calls kept failing, else
// StoreOK. Guards over one RedisStore share the state.
func (g *Guard) StoreState() StoreState {
	if g == nil || g.health == nil || !g.health.failing() {
		return StoreOK
	}
	return StoreFailing
}

// watchStoreState tells o of the changes of g's store state, when o wants
// to know (StoreStateObserver).
func (g *Guard) watchStoreState(o Observer) {
	so, ok := o.(StoreStateObserver)
	if !ok {
		return
	}
	log := g.log
	g.health.watch(func(s StoreState, err error) {
		defer func() {
			if p := recover(); p != nil {
				log.Error("idem: observer panicked", "event", "observer_panic", "panic", p)
			}
		}()
		so.StoreStateChanged(s, err)
	})
}
