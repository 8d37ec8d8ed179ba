package idem

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/idemstore"
	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/claim.lua
	claimLua string
	//go:embed lua/heartbeat.lua
	heartbeatLua string
	//go:embed lua/checkpoint.lua
	checkpointLua string
	//go:embed lua/complete.lua
	completeLua string
	//go:embed lua/release.lua
	releaseLua string
	//go:embed lua/unclaim.lua
	unclaimLua string

	claimScript      = newScript(claimLua)
	heartbeatScript  = newDirectScript(heartbeatLua)
	checkpointScript = newScript(checkpointLua)
	completeScript   = newScript(completeLua)
	releaseScript    = newScript(releaseLua)
	unclaimScript    = newScript(unclaimLua)
)

// RedisStore is the Store on Redis 7.0 or newer, standalone, with replicas,
// or Redis Cluster. Each operation has two keys sharing one hash tag,
// "<prefix>:{<id>}" for the record and "<prefix>:{<id>}:l" for the lease
// (Keys returns them), so every script touches one slot. Every key carries a TTL; Redis expiry is the
// only cleanup. Each method is one script run: EVALSHA, falling back to EVAL
// the first time a server lacks the script.
//
// The go-redis Ring client is not supported: it re-hashes keys when a shard
// drops, which breaks the at-most-once guarantee.
type RedisStore struct {
	c             redis.UniversalClient
	prefix        string
	replicas      int
	ackWait       time.Duration
	compressAbove int
	log           *slog.Logger
	bad           error        // a client the store cannot work with
	health        *storeHealth // fail-fast, shared by the Guards over the store
	autoPipe      bool         // WithAutoPipeline (the default), WithoutAutoPipeline
	pipe          *pipeline    // when batching
	errs          []string     // malformed options, for NewRedisStore's panic

	watchable    atomic.Int32           // 0 unknown, 1 sharded Pub/Sub works, 2 it does not
	warnedNotify atomic.Bool            // notifyRefused has logged
	subsMu       sync.Mutex             // guards subs
	subs         map[string]*subscriber // Pub/Sub connections of waiters, by node
}

var (
	_ idemstore.Store         = (*RedisStore)(nil)
	_ idemstore.Reader        = (*RedisStore)(nil)
	_ idemstore.Unclaimer     = (*RedisStore)(nil)
	_ idemstore.DeadlineAware = (*RedisStore)(nil)
)

// RedisOption configures a RedisStore.
type RedisOption func(*RedisStore)

// WithPrefix sets the prefix of every key the store writes. The default is
// "idem"; an empty prefix means the default. Guards with different prefixes
// on one Redis never see each other's operations. A prefix with a brace
// would take over the keys' Redis Cluster hash tag: NewRedisStore panics.
func WithPrefix(p string) RedisOption {
	return func(s *RedisStore) {
		switch {
		case strings.ContainsAny(p, "{}"):
			s.errs = append(s.errs, fmt.Sprintf("WithPrefix(%q): a prefix must not contain { or }", p))
		case p != "":
			s.prefix = p
		}
	}
}

// WithCompression sets the payload size from which stored results are
// compressed (DEFLATE), kept only when that makes them smaller. Stored
// responses are Redis memory held for the whole retention; JSON bodies
// typically shrink several times. The default is 1024 bytes; zero or
// negative turns compression off. Records are read back either way.
func WithCompression(minSize int) RedisOption {
	return func(s *RedisStore) { s.compressAbove = minSize }
}

// WithAutoPipeline makes the store batch the scripts of concurrent
// callers. It is the default: the option is kept for code written when it
// was not, and turns batching on again after a WithoutAutoPipeline earlier
// in the same list.
//
// The store batches only while its callers queue, for the client's or the
// server's CPU or a busy link; where they wait on round trips alone, a
// batch would save nothing they wait for, and every call is sent directly,
// as without batching. The store tells the two apart by timing its direct
// calls, in windows of 256: when the median call of two windows in a row
// takes over 1.5 times the quickest calls of the last 10 to 20 seconds
// (the 5th percentile of a window), the callers queue. It then batches for
// at least a second (and at least 16 windows' time), and sends one window
// directly again to see whether they still queue.
//
// No call waits behind a batch already on the wire. While batching, a call
// made while at most four calls of the store are in flight (itself
// included) is sent directly. Beyond that, a call joins the batch being
// gathered, if there is one, or starts the next: that batch goes out as
// one go-redis pipeline as soon as its first caller has let the
// goroutines ready to run make their own calls (runtime.Gosched, which
// returns at once when none is ready), and a batch of one is sent
// directly. Any number of batches may be on the wire at once, each on a
// connection of its own from the client's pool, so a batch takes a
// connection only where a call would have taken one. The callers ready to
// run share one batch, and Redis and the client spend less CPU per
// operation (one read and one write per batch instead of per command).
// Measured against plain calls at 1 to 64 concurrent callers, on loopback
// and over 500 µs and 2 ms round trips, the default store served 0.98× to
// 2.6× their operations (docs/benchmarks.md, "Batching by client count").
//
// Claims, completions, releases and checkpoints ride the batches. Lease
// renewals are always sent directly, so that a renewal never waits for
// other callers' commands. Writes that wait for replicas (WithReplicaAck)
// stay off the batches too: WAIT blocks the connection it runs on.
// Waiters, Check, Inspect and Forget use the client as before.
//
// A batched call waits for its batch until its context ends, as a call on
// the client does with ContextTimeoutEnabled, whatever the client's
// setting; its command may still run, bounded by the client's own
// timeouts. The lease is measured from before the command is sent, so a
// late batch shortens the holder's lease and never lengthens it.
//
// Batches are pipelines of the client (its Pipeline method, on its pool's
// connections; hooks see them as pipelines), so any client the store
// accepts can batch, a *redis.ClusterClient too (a batch is split by
// node). go-redis's own auto-pipeliner and the client's
// AutoPipelineOptions are not used.
func WithAutoPipeline() RedisOption {
	return func(s *RedisStore) { s.autoPipe = true }
}

// WithoutAutoPipeline makes the store send every call directly on its
// client, each command on a connection of its own, as it did before
// batching became the default (WithAutoPipeline says what batching does).
// Hooks then see every script as a command (ProcessHook), never in a
// pipeline.
func WithoutAutoPipeline() RedisOption {
	return func(s *RedisStore) { s.autoPipe = false }
}

// WithStoreLogger sets the logger Check writes its warnings to. The default
// is slog.Default().
func WithStoreLogger(l *slog.Logger) RedisOption {
	return func(s *RedisStore) {
		if l != nil {
			s.log = l
		}
	}
}

// NewRedisStore returns a store on c, which may be a *redis.Client, a
// *redis.ClusterClient or a failover client. It does no I/O; call Check at
// start-up to verify the server. A nil client or a go-redis Ring makes every
// method fail with a clear error wrapping ErrStoreUnavailable (fail closed).
// NewRedisStore panics on a malformed option, as Guard.Middleware and
// idemclient.NewTransport do; durations and sizes are clamped as each option
// says.
func NewRedisStore(c redis.UniversalClient, opts ...RedisOption) *RedisStore {
	s := &RedisStore{c: c, prefix: "idem", compressAbove: 1024, log: slog.Default(), bad: clientProblem(c), health: newStoreHealth(), autoPipe: true}
	for _, o := range opts {
		if o != nil {
			o(s)
		}
	}
	s.health.log = s.log
	if s.autoPipe && s.bad == nil { // an unusable client fails every call already
		s.pipe = newPipeline(c)
	}
	if len(s.errs) > 0 {
		panic("idem: NewRedisStore: " + strings.Join(s.errs, "; "))
	}
	return s
}

// Keys returns the Redis keys of the operation with the given id
// (Attempt.ID): its record and its lease. They share one hash tag.
func (s *RedisStore) Keys(id string) (record, lease string) {
	if s == nil {
		return "", ""
	}
	k := s.keys(id)
	return k[0], k[1]
}

// usable returns nil, or why the store cannot work, wrapping
// ErrStoreUnavailable: a nil *RedisStore, or a client it cannot use.
func (s *RedisStore) usable() error {
	switch {
	case s == nil:
		return fmt.Errorf("%w: a nil *RedisStore; create one with NewRedisStore", ErrStoreUnavailable)
	case s.bad != nil:
		return fmt.Errorf("%w: %w", ErrStoreUnavailable, s.bad)
	}
	return nil
}

// ReturnsByDeadline implements idemstore.DeadlineAware: it reports whether
// the store's calls return by their context's deadline, as go-redis's do
// with ContextTimeoutEnabled (a pipelined call always does, a lone call sent
// directly as the client does). A Guard then calls the store on its
// caller's goroutine; otherwise each call runs on a goroutine of its own,
// so that the Guard's store timeout bounds it (WithStoreTimeout).
func (s *RedisStore) ReturnsByDeadline() bool {
	if s == nil {
		return false
	}
	switch c := s.c.(type) {
	case *redis.Client:
		return c != nil && c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c != nil && c.Options().ContextTimeoutEnabled
	}
	return false
}

// clientProblem reports why the store cannot work with c, or nil.
func clientProblem(c redis.UniversalClient) error {
	switch c := c.(type) {
	case nil:
		return errors.New("idem: NewRedisStore needs a Redis client, got nil")
	case *redis.Client:
		if c == nil {
			return errors.New("idem: NewRedisStore needs a Redis client, got a nil *redis.Client")
		}
	case *redis.ClusterClient:
		if c == nil {
			return errors.New("idem: NewRedisStore needs a Redis client, got a nil *redis.ClusterClient")
		}
	case *redis.Ring:
		return errors.New("idem: go-redis Ring is not supported (it re-hashes keys when a shard drops); use Redis Cluster")
	}
	return nil
}

func (s *RedisStore) keys(id string) []string {
	both := s.prefix + ":{" + id + "}:l" // one allocation for both keys
	return []string{both[:len(both)-2], both}
}

// The ack flag of claim.lua, boxed once.
var argAck, argNoAck any = "1", "0"

// Claim implements Store.
func (s *RedisStore) Claim(ctx context.Context, id string, r idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	if err := s.usable(); err != nil {
		return idemstore.ClaimResult{}, err
	}
	c := s.call(claimScript, id, true, true)
	c.freshRecord(r.Owner, r.Fingerprint, time.Now().Unix())
	c.text(r.Owner)
	c.arg(ms(r.Lease))
	c.arg(ms(r.TTL))
	switch {
	case s.replicas > 0:
		c.arg(argAck)
	case len(r.OtherFingerprints) > 0:
		c.arg(argNoAck) // the script reads no flag on its hot paths without acks
	}
	if len(r.OtherFingerprints) > 0 {
		c.list(r.OtherFingerprints)
	}
	cmd, ackErr := s.eval(ctx, c)
	var res idemstore.ClaimResult
	v, err := cmd.Result()
	if err == nil {
		if res, err = parseClaim(v, r); err != nil {
			err = fmt.Errorf("%w (at %s)", err, c.firstKey())
		}
	}
	c.done() // the reply holds no part of the call
	if err != nil {
		return idemstore.ClaimResult{}, err
	}
	if ackErr == nil {
		return res, nil
	}
	switch res.Status {
	case idemstore.ClaimOK:
		// Too few replicas hold the claim: a failover could forget it.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), defaultWriteTimeout)
		defer cancel()
		_ = s.Release(rctx, id, r.Owner)
		return idemstore.ClaimResult{}, ackErr
	case idemstore.ClaimCompleted:
		// Too few replicas hold the result: a failover could forget it,
		// so it must not be handed out yet.
		return idemstore.ClaimResult{}, ackErr
	}
	return res, nil
}

// Heartbeat implements Store. With replica acks, a renewal counts only once
// acknowledged: a lease renewed on the primary alone may end earlier on the
// replica that replaces it.
func (s *RedisStore) Heartbeat(ctx context.Context, id, owner string, lease time.Duration) error {
	if err := s.usable(); err != nil {
		return err
	}
	c := s.call(heartbeatScript, id, false, true)
	c.text(owner)
	c.arg(ms(lease))
	cmd, ackErr := s.eval(ctx, c)
	return acked(owned(cmd.Int64()), ackErr)
}

// Checkpoint implements Store. With replica acks, a checkpoint counts only
// once acknowledged.
func (s *RedisStore) Checkpoint(ctx context.Context, id, owner, name string, value []byte) error {
	if err := s.usable(); err != nil {
		return err
	}
	c := s.call(checkpointScript, id, true, false)
	c.text(owner)
	c.text(name)
	c.bytes(value)
	cmd, ackErr := s.eval(ctx, c)
	return acked(owned(cmd.Int64()), ackErr)
}

// Complete implements Store. With replica acks, a completion counts only
// once acknowledged.
func (s *RedisStore) Complete(ctx context.Context, id, owner string, payload []byte, retention time.Duration) error {
	if err := s.usable(); err != nil {
		return err
	}
	format, payload := s.encodePayload(payload)
	c := s.call(completeScript, id, true, true)
	c.text(owner)
	c.bytes(payload)
	c.arg(ms(retention))
	c.text(format)
	cmd, ackErr := s.eval(ctx, c)
	n, err := cmd.Int64()
	c.done()
	return acked(s.published(ctx, n, err), ackErr)
}

// Release implements Store. A release is never waited for: a release that a
// failover forgets leaves the key claimed until its lease runs out.
func (s *RedisStore) Release(ctx context.Context, id, owner string) error {
	if err := s.usable(); err != nil {
		return err
	}
	c := s.call(releaseScript, id, true, true)
	c.text(owner)
	n, err := s.run(ctx, c).Int64()
	return s.published(ctx, n, err)
}

// Unclaim implements idemstore.Unclaimer: it takes back owner's claim (its
// fence goes back by one, a record it created is deleted) and leaves a
// tombstone in the lease key, for lease, that refuses a copy of owner's
// claim still on its way. Like a release, it is never waited for by
// replicas.
func (s *RedisStore) Unclaim(ctx context.Context, id, owner string, lease time.Duration) error {
	if err := s.usable(); err != nil {
		return err
	}
	c := s.call(unclaimScript, id, true, true)
	c.text(owner)
	c.arg(ms(lease))
	n, err := s.run(ctx, c).Int64()
	switch {
	case err != nil:
		return err
	case n == 0:
		return nil // no claim of owner: nothing to take back, and none will come
	case n == 3:
		return errHeldByAnother
	}
	return s.published(ctx, n, err)
}

// errHeldByAnother is Unclaim's answer when the caller holds no claim and
// another owner holds a live lease: no tombstone could be left beside it, so
// a copy of the caller's claim still on its way could take the key once
// that owner lets go. The engine tries the take-back again.
var errHeldByAnother error = &tryAgainError{"idem: another owner holds the key; the take-back is tried again"}

// storeHealth returns the fail-fast state the Guards over the store share.
func (s *RedisStore) storeHealth() *storeHealth {
	if s == nil {
		return nil
	}
	return s.health
}

// notifyRefused logs, once per store, that the server refuses idem's
// notifications to waiting duplicates, which then poll.
func (s *RedisStore) notifyRefused(ctx context.Context, why error) {
	s.watchable.Store(2)
	if s.warnedNotify.Swap(true) {
		return
	}
	s.log.WarnContext(ctx, "idem: the Redis user may not use the sharded channels "+s.prefix+":* (ACL &"+s.prefix+":*, +spublish, +ssubscribe); results are stored, but waiting duplicates poll instead of being notified",
		"event", "notify_refused", "err", why)
}

// errPublishRefused is why notifyRefused is called for a script whose
// publish the server refused.
var errPublishRefused = errors.New("idem: SPUBLISH refused in a script")

// published maps the reply of complete.lua and release.lua to nil or
// ErrLeaseLost, as owned does; their reply 2 (done, but the server refused
// to publish the waiters' notification) is done, and warns once.
func (s *RedisStore) published(ctx context.Context, n int64, err error) error {
	if err == nil && n == 2 {
		s.notifyRefused(ctx, errPublishRefused)
		n = 1
	}
	return owned(n, err)
}

// owned maps a script's 1/0 reply to nil/ErrLeaseLost.
func owned(n int64, err error) error {
	switch {
	case err != nil:
		return err
	case n != 1:
		return ErrLeaseLost
	}
	return nil
}

// ms returns d in whole milliseconds (at least 1) as a script argument.
// A Guard passes the same few durations on every call: they are boxed once.
func ms(d time.Duration) any {
	if v, ok := boxedMs.Load(d); ok {
		return v
	}
	v, _ := boxedMs.LoadOrStore(d, any(max(d.Milliseconds(), 1)))
	return v
}

var boxedMs sync.Map // time.Duration → any(int64)

// encodePayload returns the payload to store and its format: deflated when
// it is at least s.compressAbove bytes and deflating makes it smaller. A
// payload that looks random (sealed values, compressed media) is stored as
// is without trying.
func (s *RedisStore) encodePayload(p []byte) (format string, stored []byte) {
	if s.compressAbove <= 0 || len(p) < s.compressAbove || looksRandom(p) {
		return formatRaw, p
	}
	var buf bytes.Buffer
	buf.Grow(len(p) / 2)
	w := deflaters.get()
	defer deflaters.put(w)
	w.Reset(&buf)
	if _, err := w.Write(p); err != nil || w.Close() != nil || buf.Len() >= len(p) {
		return formatRaw, p
	}
	return formatDeflate, buf.Bytes()
}
