package idem

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// WithAutoPipeline makes the store send its scripts through the go-redis
// auto-pipeliner of its client ((*redis.Client).AutoPipeline or
// (*redis.ClusterClient).AutoPipeline), which batches the commands of
// concurrent callers into shared writes and reads. Under concurrency Redis
// then spends far less CPU per operation, and the store serves more
// operations per Redis core; the client's own Options.AutoPipelineOptions
// apply when set. The default is off.
//
// Claims, completions, releases and checkpoints ride the pipeliner while
// other calls of the store are in flight; a lone call is sent directly, so
// a single caller pays no batching delay. Lease renewals are always sent
// directly, so that a renewal never waits behind a batch. Writes that wait
// for replicas (WithReplicaAck) stay off the pipeliner too: WAIT blocks the
// connection it runs on. Waiters, Check, Inspect and Forget use the client
// as before.
//
// A command handed to the pipeliner is not abandoned at its context's
// deadline: the client's ReadTimeout and WriteTimeout bound it. The lease
// is measured from before the command is handed over, as without the option,
// so a late batch shortens the holder's lease and never lengthens it.
//
// The pipeliner is the client's: it starts at the first pipelined call and
// stops when the client is closed. The client must be a *redis.Client (also
// a failover client) or a *redis.ClusterClient: NewRedisStore panics on
// another client type with this option, and on invalid
// Options.AutoPipelineOptions.
func WithAutoPipeline() RedisOption {
	return func(s *RedisStore) { s.autoPipe = true }
}

// processor is what the store sends its commands to: the client, or its
// auto-pipeliner.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
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
		open, opts = c.AutoPipeline, c.Options().AutoPipelineOptions
	case *redis.ClusterClient:
		if c == nil {
			return nil, nil
		}
		open, opts = c.AutoPipeline, c.Options().AutoPipelineOptions
	case nil, *redis.Ring:
		return nil, nil
	default:
		return nil, fmt.Errorf("WithAutoPipeline needs a *redis.Client or a *redis.ClusterClient, got %T", c)
	}
	if opts != nil {
		if err := opts.Validate(); err != nil {
			return nil, fmt.Errorf("WithAutoPipeline: the client's AutoPipelineOptions: %w", err)
		}
	}
	return &pipeline{open: open}, nil
}

// sender returns where a call of the script goes: the client when the
// store is not pipelined, when the script is always sent directly, or when
// no other call is in flight; the auto-pipeliner otherwise. counted
// reports whether the call was counted in flight: the caller then calls
// s.sent once the call has its reply.
func (s *RedisStore) sender(script *luaScript) (p processor, counted bool) {
	pl := s.pipe
	if pl == nil || script.direct {
		return s.c, false
	}
	if pl.inFlight.Add(1) == 1 {
		return s.c, true
	}
	if ap := pl.pipeliner(); ap != nil {
		return ap, true
	}
	return s.c, true
}

// sent ends a call that sender counted in flight.
func (s *RedisStore) sent() { s.pipe.inFlight.Add(-1) }

// pipeliner returns the client's auto-pipeliner, opening it on first use
// and again after it was closed; nil when the client refuses one (it is
// closed), and the call then goes to the client, which reports why.
func (pl *pipeline) pipeliner() *redis.AutoPipeliner {
	if ap := pl.ap.Load(); ap != nil && !ap.IsClosed() {
		return ap
	}
	ap, err := pl.open()
	if err != nil {
		return nil
	}
	pl.ap.Store(ap)
	return ap
}
