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

// eval runs script. With replica acks (WithReplicaAck) it sends WAIT behind
// the script on the same connection, in one pipeline to the master of the
// keys' slot, since WAIT counts the writes of its own connection only; a
// NOSCRIPT reply sends the script again with EVAL. ackErr reports too few
// acknowledgements, or a WAIT that failed; the script's own reply is in cmd
// either way.
func (s *RedisStore) eval(ctx context.Context, script *luaScript, keys []string, args ...any) (cmd *redis.Cmd, ackErr error) {
	a := script.args(keys, args)
	if s.replicas == 0 {
		cmd = script.cmd(ctx, a)
		_ = s.c.Process(ctx, cmd)
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			cmd = script.cmd(ctx, script.withSource(a))
			_ = s.c.Process(ctx, cmd)
		}
		return cmd, nil
	}
	return s.evalAcked(ctx, script, keys[0], a)
}

// evalAcked runs the command a of script with WAIT behind it; see eval.
func (s *RedisStore) evalAcked(ctx context.Context, script *luaScript, key string, a []any) (cmd *redis.Cmd, ackErr error) {
	var c redis.Cmdable = s.c
	if cc, ok := s.c.(*redis.ClusterClient); ok {
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			cmd = redis.NewCmd(ctx)
			cmd.SetErr(err)
			return cmd, err
		}
		c = m
	}
	var wait *redis.IntCmd
	send := func(a []any) {
		_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
			cmd = script.cmd(ctx, a)
			_ = p.Process(ctx, cmd)
			wait = redis.NewIntCmd(ctx, "wait", s.replicas, s.ackWait.Milliseconds())
			_ = p.Process(ctx, wait)
			return nil
		})
	}
	send(a)
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		send(script.withSource(a))
	}
	n, err := wait.Result()
	switch {
	case err != nil:
		return cmd, fmt.Errorf("idem: waiting for replicas: %w", err)
	case n < int64(s.replicas):
		return cmd, fmt.Errorf("idem: %d of %d replicas acknowledged the write within %v", n, s.replicas, s.ackWait)
	}
	return cmd, nil
}

// acked returns err, or else ackErr.
func acked(err, ackErr error) error {
	if err != nil {
		return err
	}
	return ackErr
}

// luaScript is a Lua script of the store, run by its SHA1 digest (EVALSHA)
// and loaded by EVAL when the server does not know it yet.
type luaScript struct {
	src, sha any // boxed once: every command refers to them
}

func newScript(src string) *luaScript {
	return &luaScript{src: src, sha: redis.NewScript(src).Hash()}
}

// args returns the arguments of EVALSHA for keys and args, in one slice.
func (l *luaScript) args(keys []string, args []any) []any {
	a := make([]any, 3, 3+len(keys)+len(args))
	a[0], a[1], a[2] = "evalsha", l.sha, len(keys)
	for _, k := range keys {
		a = append(a, k)
	}
	return append(a, args...)
}

// withSource turns the arguments of EVALSHA into those of EVAL.
func (l *luaScript) withSource(a []any) []any {
	a[0], a[1] = "eval", l.src
	return a
}

// cmd returns the command for a, routed by its first key.
func (l *luaScript) cmd(ctx context.Context, a []any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, a...)
	cmd.SetFirstKeyPos(3)
	return cmd
}
