package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/idemtest/verify"
	"github.com/idemkit/idem/internal/redisinfo"
)

// serverState is what verify compares before and after its run to name
// the documented limits a deployment ran into: keys evicted, servers
// restarted or replaced (a failover).
type serverState struct {
	evicted  int64             // evicted_keys over every server that answered INFO
	policies map[string]string // maxmemory-policy by server
	runIDs   map[string]string // run_id by server
}

// readState reads INFO from every server; a server that refuses INFO is
// left out.
func readState(ctx context.Context, e *env) serverState {
	st := serverState{policies: map[string]string{}, runIDs: map[string]string{}}
	var mu sync.Mutex
	_ = forEachServer(ctx, e, func(ctx context.Context, c *redis.Client, name string) error {
		text, err := c.Info(ctx, "server", "stats", "memory").Result()
		if err != nil {
			return nil
		}
		info := redisinfo.Parse(text)
		n, _ := strconv.ParseInt(info["evicted_keys"], 10, 64)
		mu.Lock()
		defer mu.Unlock()
		st.evicted += n
		st.policies[name] = info["maxmemory_policy"]
		st.runIDs[name] = info["run_id"]
		return nil
	})
	return st
}

// limits records, as faults over the whole run, the documented limits the
// server ran into meanwhile, so that the violations they caused say so.
// A store without replica acknowledgements may lose writes in a failover
// as well.
func limits(ctx context.Context, e *env, timeout time.Duration, h *verify.History, before serverState, acked bool) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	after := readState(cctx, e)
	end := h.Now()
	if n := after.evicted - before.evicted; n > 0 {
		h.AddFault(verify.Fault{
			Name:  fmt.Sprintf("eviction: the server evicted %d keys (maxmemory-policy %s)", n, policies(after)),
			Limit: verify.LimitEviction, End: end,
		})
	}
	for name, id := range before.runIDs {
		if now, ok := after.runIDs[name]; ok && now != id {
			limit := verify.LimitRestart
			if !acked {
				limit = verify.LimitRestart + ", or " + verify.LimitFailover
			}
			h.AddFault(verify.Fault{
				Name:  fmt.Sprintf("%s restarted or failed over (run_id changed)", name),
				Limit: limit, End: end,
			})
		}
	}
}

// policies lists the eviction policies of the servers.
func policies(st serverState) string {
	seen := map[string]bool{}
	var out string
	for _, p := range st.policies {
		if p != "" && !seen[p] {
			seen[p] = true
			if out != "" {
				out += ", "
			}
			out += p
		}
	}
	return out
}

// cleanup deletes every key under prefix, also after an interruption, and
// says on out how many it deleted; keys it could not delete expire within
// expiry.
func cleanup(e *env, prefix string, timeout, expiry time.Duration, out io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var deleted atomic.Int64
	err := forEachServer(ctx, e, func(ctx context.Context, c *redis.Client, _ string) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, globEscape(prefix)+":*", scanCount).Result()
			if err != nil {
				return err
			}
			if len(keys) > 0 {
				// One DEL per key: a cluster node refuses keys of several
				// slots in one command. DEL, not UNLINK: the application's
				// ACL line grants it, and the values are small.
				cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
					for _, k := range keys {
						p.Del(ctx, k)
					}
					return nil
				})
				if err != nil {
					return err
				}
				for _, cmd := range cmds {
					deleted.Add(cmd.(*redis.IntCmd).Val())
				}
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	})
	if err != nil {
		fmt.Fprintf(e.stderr, "idem verify: cleanup of %s:* incomplete (its keys expire within %v): %v\n",
			prefix, expiry, err)
		return
	}
	fmt.Fprintf(out, "cleanup: deleted %d keys under %s:*\n", deleted.Load(), prefix)
}
