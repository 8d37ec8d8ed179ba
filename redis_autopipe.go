package idem

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// pipeDirect: a call with at most this many calls of the store in flight,
// itself included, is sent directly, without gathering a batch. A batch
// costs its callers a hand-off between goroutines and the others' time in
// Redis before the replies come back; a few callers sharing a batch win
// little back where they wait on round trips (2 callers over a 500 µs round
// trip: replays at 0.94× the plain calls' throughput with batches of two,
// 4 runs).
const pipeDirect = 4

// pipeline batches a store's script calls while its callers queue (see
// roundTrips). No call waits behind a batch already on the wire: a call
// made then, while more than pipeDirect calls are in flight, joins the batch being gathered, if one is, or starts the next
// one, which goes out as soon as its first caller has let the goroutines
// ready to run make their calls (runtime.Gosched, which returns at once
// when none is ready). Any number of batches may be on the wire at once,
// each on a connection of its own from the client's pool, so a batch takes
// a connection only where a call would have taken one. A batch of one
// command is sent directly on its caller's goroutine, as without batching.
//
// A batch is as large as the process is busy: where the callers wait for
// CPU, every goroutine ready to run makes its call before the first caller
// runs again, and the batch carries them all; where they wait on round
// trips, a batch carries the callers that the last replies woke together.
type pipeline struct {
	c redis.UniversalClient
	// inFlight counts the store's calls that may ride a batch (pipeDirect).
	inFlight atomic.Int32
	every    bool // every call rides a batch, a lone one too (tests)
	// load tells whether the callers queue: a call rides a batch only
	// while they do.
	load *roundTrips

	mu   sync.Mutex
	open *batch // being gathered: its first caller has not sent it yet
}

// batch is the commands gathered for one pipeline.
type batch struct{ calls []*pipeCall }

// pipeCall is a command waiting in a batch.
type pipeCall struct {
	cmd  *redis.Cmd
	done chan struct{} // receives once, when the command's batch has run
}

var (
	pipeCalls = pool[*pipeCall]{fresh: func() *pipeCall { return &pipeCall{done: make(chan struct{}, 1)} }}
	batches   = pool[*batch]{fresh: func() *batch { return new(batch) }}
)

// newPipeline returns the pipeline of c.
func newPipeline(c redis.UniversalClient) *pipeline {
	return &pipeline{c: c, load: newRoundTrips()}
}

// join reports whether a call of script may ride a batch: not when the
// store does not batch (pl is nil) or the script is always sent directly,
// nor when at most pipeDirect calls are in flight, itself included.
// counted reports whether the call was counted in flight: the caller then
// calls pl.sent once the call has its reply.
func (pl *pipeline) join(script *luaScript) (pipelined, counted bool) {
	if pl == nil || script.direct {
		return false, false
	}
	n := pl.inFlight.Add(1)
	return pl.every || n > pipeDirect && pl.load.busy(), true
}

// sent ends a call that join counted in flight.
func (pl *pipeline) sent() { pl.inFlight.Add(-1) }

// send runs cmd on the client c or, when pipelined, in a batch of pl, and
// returns the command that holds the outcome: cmd, or a command carrying
// ctx's error when ctx ended first (cmd may still run, and must not be
// read; abandoned is then true). A call that had its reply is timed for
// pl's load.
func (pl *pipeline) send(ctx context.Context, c redis.UniversalClient, pipelined bool, cmd *redis.Cmd) (out *redis.Cmd, abandoned bool) {
	if pl == nil {
		_ = c.Process(ctx, cmd)
		return cmd, false
	}
	start := pl.load.now()
	out, abandoned = pl.batched(ctx, c, pipelined, cmd)
	if !abandoned && out.Err() == nil {
		pl.load.took(start, pl.load.now(), !pipelined)
	}
	return out, abandoned
}

// batched is send once timed: it runs cmd directly or in a batch.
func (pl *pipeline) batched(ctx context.Context, c redis.UniversalClient, pipelined bool, cmd *redis.Cmd) (out *redis.Cmd, abandoned bool) {
	if !pipelined {
		_ = c.Process(ctx, cmd)
		return cmd, false
	}
	if err := ctx.Err(); err != nil {
		return failedCmd(ctx, err), true
	}
	pc := pipeCalls.get()
	pc.cmd = cmd
	pl.mu.Lock()
	if b := pl.open; b != nil {
		b.calls = append(b.calls, pc)
		pl.mu.Unlock()
		return pl.wait(ctx, pc)
	}
	b := batches.get()
	b.calls = append(b.calls, pc)
	pl.open = b
	pl.mu.Unlock()
	// The goroutines ready to run go first, and those that call the store
	// join b. With none ready, this returns at once.
	runtime.Gosched()
	pl.mu.Lock()
	pl.open = nil
	pl.mu.Unlock()
	if len(b.calls) == 1 && !pl.every {
		// Alone: sent as without batching, bounded by ctx.
		b.calls[0] = nil
		b.calls = b.calls[:0]
		batches.put(b)
		pc.cmd = nil
		pipeCalls.put(pc)
		_ = c.Process(ctx, cmd)
		return cmd, false
	}
	go pl.exec(b)
	return pl.wait(ctx, pc)
}

// wait returns pc's command once its batch has run, or a command carrying
// ctx's error when ctx, or the caller it was made for, ends first.
func (pl *pipeline) wait(ctx context.Context, pc *pipeCall) (out *redis.Cmd, abandoned bool) {
	var gone <-chan struct{} // nil: never
	caller := callerOf(ctx)
	if caller != nil {
		gone = caller.Done()
	}
	select {
	case <-pc.done:
		cmd := pc.cmd
		pc.cmd = nil
		pipeCalls.put(pc)
		return cmd, false
	case <-ctx.Done():
		// The batch still signals pc.done, which is left to the collector.
		return failedCmd(ctx, ctx.Err()), true
	case <-gone:
		return failedCmd(ctx, caller.Err()), true
	}
}

// exec sends b as one pipeline and wakes its callers. The pipeline runs
// detached from their contexts, bounded by the client's own timeouts: each
// caller stops waiting when its context ends, and the others' commands
// still run. A panic on the way (a hook's) fails the commands that have no
// outcome yet: on a direct call it would reach the caller, who may recover
// it; here it would end the process.
func (pl *pipeline) exec(b *batch) {
	defer func() {
		if r := recover(); r != nil {
			err := fmt.Errorf("idem: a batch of the store panicked: %v", r)
			for _, pc := range b.calls {
				if pc.cmd.Err() == nil && pc.cmd.Val() == nil {
					pc.cmd.SetErr(err)
				}
			}
		}
		for _, pc := range b.calls {
			pc.done <- struct{}{}
		}
		clear(b.calls)
		b.calls = b.calls[:0]
		batches.put(b)
	}()
	ctx := context.Background()
	p := pl.c.Pipeline()
	for _, pc := range b.calls {
		_ = p.Process(ctx, pc.cmd)
	}
	_, _ = p.Exec(ctx)
}

// failedCmd returns a command that holds err.
func failedCmd(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}
