package idem

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/internal/redisauth"
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
// It reads the version and the eviction policy from INFO (CONFIG GET only
// when INFO lacks the policy). It logs a warning, and passes, when sharded
// Pub/Sub on the prefix's channels is refused (waiters poll), when INFO is
// refused (the version could not be verified) and CONFIG too (nor the
// eviction policy), and when maxmemory-policy lets Redis evict keys (every
// key idem writes has a TTL, so any policy but noeviction may drop claims
// and results under memory pressure, and with them the guarantee). The
// probes use one key under the prefix per master, deleted again (or
// expiring within 10s), and
// write nothing else. A server it cannot reach, or that refuses the
// client's credentials (a wrong password, an unknown or disabled user, no
// password where one is needed), is ErrStoreUnavailable; the latter's
// message says that authentication failed and names the user.
//
// While the store is failing (its calls kept failing, see WithStoreTimeout)
// Check returns ErrStoreUnavailable at once, except every 100ms, when it
// goes out as the probe whose answer ends the failing state: a readiness
// probe that calls Check sees the state, and helps end it.
func (s *RedisStore) Check(ctx context.Context) (err error) {
	if err := s.usable(); err != nil {
		return err
	}
	probe, err := s.health.admit()
	if err != nil {
		return err
	}
	sent := time.Now()
	defer func() { s.health.report(probe, sent, endOf(ctx, err), err, defaultStoreTimeout) }()
	cc, ok := s.c.(*redis.ClusterClient)
	if !ok {
		return s.checkNode(ctx, s.c, "", s.prefix+":{idem-check}")
	}
	keys, err := s.probeKeys(ctx, cc)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStoreUnavailable, redisauth.Explain(err, strings.Join(cc.Options().Addrs, ","), cc))
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
	n := &nodeCheck{s: s, c: c, addr: addr, key: key}
	for _, probe := range []func(context.Context) error{n.server, n.keys, n.scripts, n.channels, n.wait} {
		if err := probe(ctx); err != nil {
			return fmt.Errorf("%w: %w", ErrStoreUnavailable, redisauth.Explain(err, addr, c))
		}
	}
	if len(n.problems) > 0 {
		return fmt.Errorf("idem: Redis at %s: %s", addr, strings.Join(n.problems, "; "))
	}
	return nil
}

// nodeCheck is Check's probing of one server: each probe adds what is
// missing to problems, logs what it warns about, and returns only an error
// that ends the check (the server could not be reached, or refused the
// client's credentials).
type nodeCheck struct {
	s        *RedisStore
	c        redis.UniversalClient
	addr     string
	key      string // the probe key, under the prefix, on this server
	problems []string
}

func (n *nodeCheck) fail(format string, args ...any) {
	n.problems = append(n.problems, fmt.Sprintf(format, args...))
}

func (n *nodeCheck) warn(ctx context.Context, event, msg string, err error) {
	n.s.log.WarnContext(ctx, "idem: "+msg, "event", event, "addr", n.addr, "err", err)
}

// failedToReach returns err when it is not the server's refusal.
func failedToReach(err error) error {
	if err != nil && !isReply(err) {
		return err
	}
	return nil
}

// server checks the version and the eviction policy, where the user may
// read them: both from INFO (sections server and memory), the policy from
// CONFIG GET only when INFO does not give it.
func (n *nodeCheck) server(ctx context.Context) error {
	text, err := n.c.Info(ctx, "server", "memory").Result()
	var info map[string]string
	switch {
	case err == nil:
		info = redisinfo.Parse(text)
		srv := redisinfo.ServerOf(info)
		if major, ok := srv.RedisMajor(); ok && major < 7 {
			n.fail("%s is not supported: idem needs Redis 7.0 or newer", srv)
		}
	case !isReply(err):
		return err
	default:
		n.warn(ctx, "version_unverified", "could not read the server's version (INFO refused); verify Redis 7.0 or newer by hand: redis-cli INFO server", err)
	}
	policy := info["maxmemory_policy"]
	if policy == "" {
		reply, err := n.c.ConfigGet(ctx, "maxmemory-policy").Result()
		switch {
		case err != nil && !isReply(err):
			return err
		case err != nil || reply["maxmemory-policy"] == "":
			n.warn(ctx, "eviction_unverified", "could not read maxmemory-policy (neither INFO nor CONFIG GET gave it: refused or renamed); verify noeviction by hand: redis-cli INFO memory as an admin user, or the service's parameter group", err)
			return nil
		}
		policy = reply["maxmemory-policy"]
	}
	if policy != "noeviction" {
		n.s.log.WarnContext(ctx, "idem: Redis may evict idempotency records under memory pressure; set maxmemory-policy noeviction", "event", "eviction_policy",
			"addr", n.addr, "maxmemory-policy", policy)
	}
	return nil
}

// keys reads the probe key as Inspect reads a record.
func (n *nodeCheck) keys(ctx context.Context) error {
	_, err := n.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Get(ctx, n.key)
		p.PTTL(ctx, n.key)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		if !isReply(err) {
			return err
		}
		n.fail("the user may not read keys under %s:* (GET, PTTL in MULTI/EXEC): %v", n.s.prefix, err)
	}
	return nil
}

// scripts runs the probe script by EVAL, which loads it, then by EVALSHA.
func (n *nodeCheck) scripts(ctx context.Context) error {
	for _, source := range []bool{true, false} {
		call := n.s.call(probeScript, "", false, false)
		call.argv[2] = 1
		call.text(n.key)
		call.text(newToken())
		cmd := call.cmd(ctx, source)
		_ = n.c.Process(ctx, cmd)
		v, err := cmd.Slice()
		name := strings.ToUpper(cmd.Name())
		switch {
		case failedToReach(err) != nil:
			return err
		case err != nil && strings.Contains(err.Error(), "key"):
			n.fail("the user may not read and write keys under %s:* (%s): %v", n.s.prefix, name, err)
			return nil
		case err != nil:
			n.fail("the user may not run %s: %v", name, err)
			return nil
		case len(v) == 2 && v[0] == "SPUBLISH":
			if source {
				n.warn(ctx, "notify_refused", "the user may not publish on the channels "+n.s.prefix+":* (ACL &"+n.s.prefix+":*, +spublish); waiters will poll", fmt.Errorf("%v", v[1]))
			}
		case len(v) == 2 && strings.Contains(fmt.Sprint(v[1]), "key"):
			n.fail("the user may not read and write keys under %s:* (%v in a script): %v", n.s.prefix, v[0], v[1])
			return nil
		case len(v) == 2:
			n.fail("the user may not run %v in a script: %v", v[0], v[1])
			return nil
		}
	}
	return nil
}

// channels subscribes as a waiter does.
func (n *nodeCheck) channels(ctx context.Context) error {
	err := probeSubscribe(ctx, n.c, n.key+":n")
	if failedToReach(err) != nil {
		return err
	}
	if err != nil {
		n.warn(ctx, "notify_refused", "the user may not subscribe to the channels "+n.s.prefix+":* (ACL &"+n.s.prefix+":*, +ssubscribe); waiters will poll", err)
	}
	return nil
}

// wait runs WAIT, when the store waits for replicas.
func (n *nodeCheck) wait(ctx context.Context) error {
	if n.s.replicas == 0 {
		return nil
	}
	err := n.c.Do(ctx, "WAIT", 0, 1).Err()
	if failedToReach(err) != nil {
		return err
	}
	if err != nil {
		n.fail("the user may not run WAIT, which WithReplicaAck needs: %v", err)
	}
	return nil
}

// isReply reports whether err is an error reply of the server (a refused
// or unknown command), rather than a failure to reach it or to log in.
func isReply(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && !errors.Is(err, redis.Nil) && !redisauth.Refused(err)
}

// clientAddr names the server of a client that is not part of a cluster.
func clientAddr(c redis.UniversalClient) string {
	if rc, ok := c.(*redis.Client); ok {
		return rc.Options().Addr
	}
	return "the server"
}
