package idem

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/internal/redisinfo"
)

var (
	//go:embed lua/probe.lua
	probeLua    string
	probeScript = newScript(probeLua)
)

// Check verifies, at start-up, that the server and the Redis user can serve
// idem, on every master of a Redis Cluster. It returns an error, naming what
// is missing, for:
//   - Redis older than 7.0;
//   - keys under the prefix that the user may not read and write;
//   - scripts the user may not run: EVALSHA, EVAL (needed when a server lost
//     its script cache) and the commands the scripts call;
//   - WAIT refused, when WithReplicaAck is set.
//
// It logs a warning, and passes, when sharded Pub/Sub on the prefix's
// channels is refused (waiters poll), when INFO or CONFIG is refused or
// renamed (the version or the eviction policy could not be verified), and
// when maxmemory-policy lets Redis evict keys (every key idem writes has a
// TTL, so any policy but noeviction may drop claims and results under
// memory pressure, and with them the guarantee). The probes use one key
// under the prefix per master, deleted again (or expiring within 10s), and
// write nothing else. A server it cannot reach is ErrStoreUnavailable.
func (s *RedisStore) Check(ctx context.Context) error {
	if err := s.usable(); err != nil {
		return err
	}
	cc, ok := s.c.(*redis.ClusterClient)
	if !ok {
		return s.checkNode(ctx, s.c, "", s.prefix+":{idem-check}")
	}
	keys, err := s.probeKeys(ctx, cc)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		addr := m.Options().Addr
		return s.checkNode(ctx, m, addr, keys[addr])
	})
}

// probeKeys returns, for each master of the cluster, a probe key under the
// prefix that the master serves.
func (s *RedisStore) probeKeys(ctx context.Context, cc *redis.ClusterClient) (map[string]string, error) {
	var masters atomic.Int32
	if err := cc.ForEachMaster(ctx, func(context.Context, *redis.Client) error { masters.Add(1); return nil }); err != nil {
		return nil, err
	}
	keys := map[string]string{}
	for i := 0; len(keys) < int(masters.Load()) && i < 100000; i++ {
		k := s.prefix + ":{idem-check-" + strconv.Itoa(i) + "}"
		m, err := cc.MasterForKey(ctx, k)
		if err != nil {
			return nil, err
		}
		if _, ok := keys[m.Options().Addr]; !ok {
			keys[m.Options().Addr] = k
		}
	}
	return keys, nil
}

// checkNode runs Check's probes on one server; addr names it in messages
// ("" for the client's own).
func (s *RedisStore) checkNode(ctx context.Context, c redis.UniversalClient, addr, key string) error {
	if addr == "" {
		addr = clientAddr(c)
	}
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	warn := func(event, msg string, err error) {
		s.log.WarnContext(ctx, "idem: "+msg, "event", event, "addr", addr, "err", err)
	}

	// The server: version and eviction policy, where the user may read them.
	info, err := c.Info(ctx, "server").Result()
	switch {
	case err == nil:
		srv := redisinfo.ServerOf(redisinfo.Parse(info))
		if major, ok := srv.RedisMajor(); ok && major < 7 {
			fail("%s is not supported: idem needs Redis 7.0 or newer", srv)
		}
	case !isReply(err):
		return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	default:
		warn("version_unverified", "could not read the server's version (INFO refused); verify Redis 7.0 or newer by hand: redis-cli INFO server", err)
	}
	policy, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	switch {
	case err != nil && !isReply(err):
		return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	case err != nil || policy["maxmemory-policy"] == "":
		warn("eviction_unverified", "could not read maxmemory-policy (CONFIG refused or renamed); verify noeviction by hand: redis-cli CONFIG GET maxmemory-policy, or the service's parameter group", err)
	case policy["maxmemory-policy"] != "noeviction":
		s.log.WarnContext(ctx, "idem: Redis may evict idempotency records under memory pressure; set maxmemory-policy noeviction", "event", "eviction_policy",
			"addr", addr, "maxmemory-policy", policy["maxmemory-policy"])
	}

	// Keys under the prefix, read as Inspect reads them.
	if _, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Get(ctx, key)
		p.PTTL(ctx, key)
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		if !isReply(err) {
			return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
		}
		fail("the user may not read keys under %s:* (GET, PTTL in MULTI/EXEC): %v", s.prefix, err)
	}

	// The scripts: EVAL, which loads the probe script, then EVALSHA.
	for _, source := range []bool{true, false} {
		c2 := s.call(probeScript, "", false, false)
		c2.argv[2] = 1
		c2.text(key)
		c2.text(newToken())
		cmd := c2.cmd(ctx, source)
		_ = c.Process(ctx, cmd)
		v, err := cmd.Slice()
		if err != nil {
			if !isReply(err) {
				return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
			}
			if strings.Contains(err.Error(), "key") {
				fail("the user may not read and write keys under %s:* (%s): %v", s.prefix, strings.ToUpper(cmd.Name()), err)
			} else {
				fail("the user may not run %s: %v", strings.ToUpper(cmd.Name()), err)
			}
			break
		}
		if len(v) != 2 {
			continue
		}
		what, msg := fmt.Sprint(v[0]), fmt.Sprint(v[1])
		switch {
		case what == "SPUBLISH":
			if source {
				warn("notify_refused", "the user may not publish on the channels "+s.prefix+":* (ACL &"+s.prefix+":*, +spublish); waiters will poll", errors.New(msg))
			}
			continue
		case strings.Contains(msg, "key"):
			fail("the user may not read and write keys under %s:* (%s in a script): %s", s.prefix, what, msg)
		default:
			fail("the user may not run %s in a script: %s", what, msg)
		}
		break
	}

	// Waiters' subscriptions.
	if err := probeSubscribe(ctx, c, key+":n"); err != nil {
		if !isReply(err) {
			return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
		}
		warn("notify_refused", "the user may not subscribe to the channels "+s.prefix+":* (ACL &"+s.prefix+":*, +ssubscribe); waiters will poll", err)
	}

	// Replica acknowledgements.
	if s.replicas > 0 {
		if err := c.Do(ctx, "WAIT", 0, 1).Err(); err != nil {
			if !isReply(err) {
				return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
			}
			fail("the user may not run WAIT, which WithReplicaAck needs: %v", err)
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("idem: Redis at %s: %s", addr, strings.Join(problems, "; "))
	}
	return nil
}

// isReply reports whether err is an error reply of the server (a refused
// or unknown command), rather than a failure to reach it.
func isReply(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && !errors.Is(err, redis.Nil)
}

// clientAddr names the server of a client that is not part of a cluster.
func clientAddr(c redis.UniversalClient) string {
	if rc, ok := c.(*redis.Client); ok {
		return rc.Options().Addr
	}
	return "the server"
}
