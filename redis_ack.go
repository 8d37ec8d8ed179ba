package idem

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// WithReplicaAck makes every claim, renewal, checkpoint and completion wait,
// with Redis WAIT, until n replicas acknowledged it, for at most timeout;
// and a replay (or a waiter's wake-up) is handed out only once n replicas
// hold the completed record. WAIT is pipelined behind the script on the same
// connection, so it costs no extra round trip but the replicas' own delay.
// A write that too few replicas acknowledged in time is a store failure:
// a claim is released and fn does not run (ErrStoreUnavailable), a
// completion is ErrNotRecorded, a renewal does not count.
//
// It closes the window in which a failover to an asynchronous replica
// loses a claim or a result, provided the replica promoted is one that
// acknowledged: with n of m replicas, Redis Sentinel promotes the most
// up-to-date one; a manual promotion of a lagging replica can still lose a
// claim. Keep timeout below the client's ReadTimeout; zero or negative
// means 1s (a WAIT without a timeout would block for ever). The default,
// n = 0 (or negative), does not wait.
func WithReplicaAck(n int, timeout time.Duration) RedisOption {
	return func(s *RedisStore) {
		s.replicas = max(n, 0)
		s.ackWait = timeout
		if timeout <= 0 {
			s.ackWait = time.Second
		}
	}
}

// eval runs the call. With replica acks (WithReplicaAck) it sends WAIT
// behind the script on the same connection, in one pipeline to the master
// of the keys' slot, since WAIT counts the writes of its own connection
// only; a NOSCRIPT reply sends the script again with EVAL. ackErr reports
// too few acknowledgements, or a WAIT that failed; the script's own reply is
// in cmd either way.
func (s *RedisStore) eval(ctx context.Context, c *scriptCall) (cmd *redis.Cmd, ackErr error) {
	if s.replicas == 0 {
		return s.run(ctx, c), nil
	}
	return s.evalAcked(ctx, c)
}

// run runs the call alone, without WAIT, on the client or in a batch of
// the store's pipeline (WithAutoPipeline); a NOSCRIPT reply sends the
// script again with EVAL.
func (s *RedisStore) run(ctx context.Context, c *scriptCall) *redis.Cmd {
	pipelined, counted := s.pipe.join(c.script)
	if counted {
		defer s.pipe.sent()
	}
	cmd, abandoned := s.pipe.send(ctx, s.c, pipelined, c.cmd(ctx, false))
	if err := cmd.Err(); !abandoned && err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmd, abandoned = s.pipe.send(ctx, s.c, pipelined, c.cmd(ctx, true))
	}
	c.running = abandoned
	return cmd
}

// evalAcked runs the call with WAIT behind it; see eval.
func (s *RedisStore) evalAcked(ctx context.Context, c *scriptCall) (cmd *redis.Cmd, ackErr error) {
	var cl redis.Cmdable = s.c
	if cc, ok := s.c.(*redis.ClusterClient); ok {
		m, err := cc.MasterForKey(ctx, c.firstKey())
		if err != nil {
			cmd = redis.NewCmd(ctx)
			cmd.SetErr(err)
			return cmd, err
		}
		cl = m
	}
	var wait *redis.IntCmd
	send := func(source bool) {
		_, _ = cl.Pipelined(ctx, func(p redis.Pipeliner) error {
			cmd = c.cmd(ctx, source)
			_ = p.Process(ctx, cmd)
			wait = redis.NewIntCmd(ctx, "wait", s.replicas, s.ackWait.Milliseconds())
			_ = p.Process(ctx, wait)
			return nil
		})
	}
	send(false)
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		send(true)
	}
	n, err := wait.Result()
	switch {
	case err != nil:
		return cmd, fmt.Errorf("idem: waiting for replicas: %w", err)
	case n < int64(s.replicas):
		return cmd, &unackedError{n: n, want: s.replicas, wait: s.ackWait}
	}
	return cmd, nil
}

// unackedError reports a write that too few replicas acknowledged in time:
// the server answered, and the write ran on the master alone.
type unackedError struct {
	n    int64
	want int
	wait time.Duration
}

func (e *unackedError) Error() string {
	return fmt.Sprintf("idem: %d of %d replicas acknowledged the write within %v", e.n, e.want, e.wait)
}

// answeredByStore marks the error as the store's answer (answeredError):
// a claim it refused was released already.
func (*unackedError) answeredByStore() {}

// acked returns err, or else ackErr.
func acked(err, ackErr error) error {
	if err != nil {
		return err
	}
	return ackErr
}
