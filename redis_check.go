package idem

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Check verifies the server at start-up: it returns an error for Redis older
// than 7.0, and logs a warning when maxmemory-policy lets Redis evict keys
// (every key idem writes has a TTL, so any policy but noeviction may drop
// claims and results under memory pressure, and with them the guarantee).
// Servers that do not expose INFO or CONFIG are not checked. On Redis
// Cluster every master is checked.
func (s *RedisStore) Check(ctx context.Context) error {
	if err := s.usable(); err != nil {
		return err
	}
	check := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "server").Result()
		if err != nil {
			return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
		}
		if v := infoField(info, "redis_version"); v != "" {
			if major, _ := strconv.Atoi(strings.SplitN(v, ".", 2)[0]); major < 7 {
				return fmt.Errorf("idem: Redis %s at %s is not supported: it needs 7.0 or newer", v, c.Options().Addr)
			}
		}
		policy, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		if err == nil && policy["maxmemory-policy"] != "" && policy["maxmemory-policy"] != "noeviction" {
			s.log.WarnContext(ctx, "idem: Redis may evict idempotency records under memory pressure; set maxmemory-policy noeviction", "event", "eviction_policy",
				"addr", c.Options().Addr, "maxmemory-policy", policy["maxmemory-policy"])
		}
		return nil
	}
	switch c := s.c.(type) {
	case *redis.Client:
		return check(ctx, c)
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, check)
	}
	return nil
}

func infoField(info, name string) string {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
