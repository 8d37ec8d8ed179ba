package idem

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// WithAutoPipeline makes the store send its scripts through the go-redis
// auto-pipeliner of its client ((*redis.Client).AsyncAutoPipeline or
// (*redis.ClusterClient).AsyncAutoPipeline, on which each call waits for its
// own command), which batches the commands of concurrent callers into shared
// writes and reads. Under concurrency Redis then spends far less CPU per
// operation, and the store serves more operations per Redis core; the
// client's own Options.AutoPipelineOptions apply when set. The default is
// off.
//
// Claims, completions, releases and checkpoints ride the pipeliner while
// other calls of the store are in flight; a lone call is sent directly, so
// a single caller pays no batching delay. Lease renewals are always sent
// directly, so that a renewal never waits behind a batch. Writes that wait
// for replicas (WithReplicaAck) stay off the pipeliner too: WAIT blocks the
// connection it runs on. Waiters, Check, Inspect and Forget use the client
// as before.
//
// A call waits for its batch until its context ends, as a call on the client
// does with ContextTimeoutEnabled, whatever the client's setting; a command
// already handed over may still run. The lease is measured from before the
// command is handed over, as without the option, so a late batch shortens
// the holder's lease and never lengthens it.
//
// The pipeliner is the client's: it starts at the first pipelined call and
// stops when the client is closed. The client must be a *redis.Client (also
// a failover client) or a *redis.ClusterClient: NewRedisStore panics on
// another client type with this option, and on Options.AutoPipelineOptions
// that the pipeliner refuses; options it refuses only when it opens (full
// duplex without a pipeline pool) fail every pipelined call with
// ErrStoreUnavailable.
func WithAutoPipeline() RedisOption {
	return func(s *RedisStore) { s.autoPipe = true }
}

// send runs cmd on the client or, when ap is not nil, on the
// auto-pipeliner, and returns the command that holds the outcome: cmd, or
// a command carrying ctx's error when ctx ended first (cmd may still run,
// and must not be read; abandoned is then true).
func (s *RedisStore) send(ctx context.Context, ap *redis.AutoPipeliner, cmd *redis.Cmd) (out *redis.Cmd, abandoned bool) {
	if ap == nil {
		_ = s.c.Process(ctx, cmd)
		return cmd, false
	}
	err := ctx.Err()
	if err == nil {
		err = ap.Submit(ctx, cmd).WaitContext(ctx)
	}
	if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
		out := redis.NewCmd(ctx)
		out.SetErr(err)
		return out, true
	}
	return cmd, false
}

// pipeline is the auto-pipeliner of a store's client, obtained at the first
// call that uses it.
type pipeline struct {
	open     func() (*redis.AutoPipeliner, error)
	ap       atomic.Pointer[redis.AutoPipeliner]
	inFlight atomic.Int32 // store calls being sent, pipelined or not
}

// newPipeline returns the pipeline of c, or why c cannot have one. A nil
// client or a Ring has none and no error: the store fails every call
// already.
func newPipeline(c redis.UniversalClient) (*pipeline, error) {
	var (
		open func() (*redis.AutoPipeliner, error)
		opts *redis.AutoPipelineOptions
	)
	switch c := c.(type) {
	case *redis.Client:
		if c == nil {
			return nil, nil
		}
		open, opts = c.AsyncAutoPipeline, c.Options().AutoPipelineOptions
	case *redis.ClusterClient:
		if c == nil {
			return nil, nil
		}
		open, opts = c.AsyncAutoPipeline, c.Options().AutoPipelineOptions
	case nil, *redis.Ring:
		return nil, nil
	default:
		return nil, fmt.Errorf("WithAutoPipeline needs a *redis.Client or a *redis.ClusterClient, got %T", c)
	}
	if err := validPipeline(c, opts); err != nil {
		return nil, fmt.Errorf("WithAutoPipeline: the client's AutoPipelineOptions: %w", err)
	}
	return &pipeline{open: open}, nil
}

// validPipeline reports what go-redis would refuse in opts when it opens
// c's deferred auto-pipeliner, as far as the options tell.
func validPipeline(c redis.UniversalClient, opts *redis.AutoPipelineOptions) error {
	if opts == nil {
		return nil
	}
	if err := opts.Validate(); err != nil {
		return err
	}
	if _, ok := c.(*redis.Client); ok && opts.NumShards > 1 && !opts.Unordered && !opts.FullDuplex {
		return fmt.Errorf("NumShards=%d needs Unordered on the deferred auto-pipeliner the store uses", opts.NumShards)
	}
	return nil
}

// sender returns the auto-pipeliner when a call of the script rides it, or
// nil when it goes to the client: when the store is not pipelined, when the
// script is always sent directly, or when no other call is in flight.
// counted reports whether the call was counted in flight: the caller then
// calls s.sent once the call has its reply. err is why the client refused
// its pipeliner.
func (s *RedisStore) sender(script *luaScript) (ap *redis.AutoPipeliner, counted bool, err error) {
	pl := s.pipe
	if pl == nil || script.direct {
		return nil, false, nil
	}
	if pl.inFlight.Add(1) == 1 {
		return nil, true, nil
	}
	ap, err = pl.pipeliner()
	return ap, true, err
}

// sent ends a call that sender counted in flight.
func (s *RedisStore) sent() { s.pipe.inFlight.Add(-1) }

// pipeliner returns the client's auto-pipeliner, opening it on first use
// and again after it was closed. It returns nil and no error when the
// client is closed: the call then goes to the client, which says so; and an
// error when the client refuses a pipeliner for its options.
func (pl *pipeline) pipeliner() (*redis.AutoPipeliner, error) {
	if ap := pl.ap.Load(); ap != nil && !ap.IsClosed() {
		return ap, nil
	}
	ap, err := pl.open()
	switch {
	case errors.Is(err, redis.ErrClosed):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("idem: WithAutoPipeline: %w", err)
	}
	pl.ap.Store(ap)
	return ap, nil
}
