package idem

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
)

// answerHook answers every command with reply at once, without a server:
// what is left of a call is the client's own work and the store's around it.
type answerHook struct{ reply any }

func (answerHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h answerHook) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(_ context.Context, cmd redis.Cmder) error {
		if c, ok := cmd.(*redis.Cmd); ok {
			c.SetVal(h.reply)
		}
		return nil
	}
}

func (answerHook) ProcessPipelineHook(redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(context.Context, []redis.Cmder) error { return nil }
}

// BenchmarkSendDirect is what a store that may batch (the default) adds to
// a call it sends directly, as at a few callers: the count of calls in
// flight and the timing of the call for its load (roundTrips), against a
// store that never batches (WithoutAutoPipeline). The commands are
// answered by a hook, so the difference is the whole cost.
func BenchmarkSendDirect(b *testing.B) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	c.AddHook(answerHook{int64(1)})
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		pl   *pipeline
	}{{"never-batches", nil}, {"may-batch", newPipeline(c)}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				pipelined, counted := tc.pl.join(claimScript)
				cmd, _ := tc.pl.send(ctx, c, pipelined, redis.NewCmd(ctx, "EVALSHA", "x", 0))
				if counted {
					tc.pl.sent()
				}
				if pipelined || cmd.Err() != nil {
					b.Fatalf("pipelined %v, err %v", pipelined, cmd.Err())
				}
			}
		})
	}
}
