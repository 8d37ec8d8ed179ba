package idem

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// pipeSlots is how many batches of one store may be on the wire at once.
// With one, Redis and the callers take turns: the server waits while the
// callers of the last batch prepare their next commands, and they wait
// while it runs the batch. With two, one batch runs while the next fills.
// More slots split the callers into smaller batches, which cost both sides
// more per command.
const pipeSlots = 2

// pipeline batches a store's script calls (WithAutoPipeline): a call made
// while another of the store's calls is in flight joins a queue, and the
// queue is sent as one go-redis pipeline as soon as fewer than pipeSlots
// batches are on the wire, so concurrent callers share writes, reads and
// system calls on both sides. A batch never waits for more commands: the
// commands queued while one is on the wire make the next.
type pipeline struct {
	c        redis.UniversalClient
	inFlight atomic.Int32 // store calls being sent, pipelined or not

	mu      sync.Mutex
	queue   []*pipeCall // waiting for the next batch
	running int         // batches being sent, at most pipeSlots
}

// pipeCall is a command waiting in a pipeline.
type pipeCall struct {
	cmd  *redis.Cmd
	done chan struct{} // receives once, when the command's batch has run
}

var pipeCalls = sync.Pool{New: func() any { return &pipeCall{done: make(chan struct{}, 1)} }}

// newPipeline returns the pipeline of c; nil for a nil client, whose store
// fails every call already.
func newPipeline(c redis.UniversalClient) *pipeline {
	if unusable(c) != nil {
		return nil
	}
	return &pipeline{c: c}
}

// join reports whether a call of script rides the pipeline: not when the
// store is not pipelined (pl is nil) or the script is always sent directly,
// nor when no other call is in flight. counted reports whether the call
// was counted in flight: the caller then calls pl.sent once the call has
// its reply.
func (pl *pipeline) join(script *luaScript) (pipelined, counted bool) {
	if pl == nil || script.direct {
		return false, false
	}
	return pl.inFlight.Add(1) > 1, true
}

// sent ends a call that join counted in flight.
func (pl *pipeline) sent() { pl.inFlight.Add(-1) }

// send runs cmd on the client c or, when pipelined, in the next batch of
// pl, and returns the command that holds the outcome: cmd, or a command
// carrying ctx's error when ctx ended first (cmd may still run, and must
// not be read; abandoned is then true).
func (pl *pipeline) send(ctx context.Context, c redis.UniversalClient, pipelined bool, cmd *redis.Cmd) (out *redis.Cmd, abandoned bool) {
	if !pipelined {
		_ = c.Process(ctx, cmd)
		return cmd, false
	}
	if err := ctx.Err(); err != nil {
		return failedCmd(ctx, err), true
	}
	pc := pipeCalls.Get().(*pipeCall)
	pc.cmd = cmd
	pl.mu.Lock()
	pl.queue = append(pl.queue, pc)
	var batch []*pipeCall
	if pl.running < pipeSlots {
		pl.running++
		batch, pl.queue = pl.queue, nil
	}
	pl.mu.Unlock()
	if batch != nil {
		go pl.drain(batch)
	}
	select {
	case <-pc.done:
		pc.cmd = nil
		pipeCalls.Put(pc)
		return cmd, false
	case <-ctx.Done():
		// The batch still signals pc.done, which is left to the collector.
		return failedCmd(ctx, ctx.Err()), true
	}
}

// drain sends batch, then the commands queued meanwhile, until none are
// left. The batches run detached from their callers' contexts, bounded by
// the client's own timeouts: each caller stops waiting when its context
// ends, and the others' commands still run.
func (pl *pipeline) drain(batch []*pipeCall) {
	ctx := context.Background()
	for {
		p := pl.c.Pipeline()
		for _, pc := range batch {
			_ = p.Process(ctx, pc.cmd)
		}
		_, _ = p.Exec(ctx) // each command holds its own outcome
		for _, pc := range batch {
			pc.done <- struct{}{}
		}
		clear(batch)
		pl.mu.Lock()
		// The sent batch's array becomes the next queue.
		batch, pl.queue = pl.queue, batch[:0]
		if len(batch) == 0 {
			pl.running--
			pl.mu.Unlock()
			return
		}
		pl.mu.Unlock()
	}
}

// failedCmd returns a command that holds err.
func failedCmd(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}
