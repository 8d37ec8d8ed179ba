package idem

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// sendCmd runs cmd on the client c or, when ap is not nil, on the
// auto-pipeliner, and returns the command that holds the outcome: cmd, or
// a command carrying ctx's error when ctx ended first (cmd may still run,
// and must not be read; abandoned is then true).
func sendCmd(ctx context.Context, c redis.UniversalClient, ap *redis.AutoPipeliner, cmd *redis.Cmd) (out *redis.Cmd, abandoned bool) {
	if ap == nil {
		_ = c.Process(ctx, cmd)
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

// newPipeline returns the pipeline of c, or why c cannot have one (the
// store names the option). A nil
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
		return nil, fmt.Errorf("needs a *redis.Client or a *redis.ClusterClient, got %T", c)
	}
	if err := validPipeline(c, opts); err != nil {
		return nil, fmt.Errorf("the client's AutoPipelineOptions: %w", err)
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
// nil when it goes to the client: when the store is not pipelined (pl is
// nil), when the script is always sent directly, or when no other call is
// in flight. counted reports whether the call was counted in flight: the
// caller then calls pl.sent once the call has its reply. err is why the client refused
// its pipeliner.
func (pl *pipeline) sender(script *luaScript) (ap *redis.AutoPipeliner, counted bool, err error) {
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
func (pl *pipeline) sent() { pl.inFlight.Add(-1) }

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
		return nil, fmt.Errorf("idem: the client's auto-pipeliner: %w", err)
	}
	pl.ap.Store(ap)
	return ap, nil
}
