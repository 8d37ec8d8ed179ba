package idemcaddy

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
)

// clients holds one Redis client per redis URL, shared by every handler
// that names it, in this configuration and the next: a reload provisions
// the new configuration (one more user) before it cleans up the old one
// (one fewer), so the client and its connections outlive the reload. The
// last user's Cleanup closes it.
var clients = caddy.NewUsagePool()

// sharedClient is a pooled Redis client.
type sharedClient struct {
	redis.UniversalClient
}

// Destruct implements caddy.Destructor: the last user is gone.
func (c sharedClient) Destruct() error { return c.Close() }

// loadClient returns the client for raw, making it on first use. Every call
// that succeeds must be matched by releaseClient(raw).
func loadClient(raw string) (redis.UniversalClient, error) {
	v, _, err := clients.LoadOrNew(raw, func() (caddy.Destructor, error) {
		c, err := newClient(raw)
		if err != nil {
			return nil, err
		}
		return sharedClient{c}, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(sharedClient).UniversalClient, nil
}

// releaseClient gives up one use of raw's client.
func releaseClient(raw string) error {
	_, err := clients.Delete(raw)
	return err
}

// newClient returns a client for a redis URL: redis://, rediss:// and
// unix:// as go-redis parses them (redis.ParseURL: options such as
// dial_timeout, read_timeout and pool_size in the query), or a Redis
// Cluster as redis+cluster://host:port,host:port[?options] (rediss+cluster
// for TLS). Deadlines of request contexts are honoured. It does no I/O.
func newClient(raw string) (redis.UniversalClient, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, errors.New("redis: not a URL: want redis://host:port, rediss://host:port, unix:///path or redis+cluster://host:port,host:port")
	}
	switch scheme {
	case "redis", "rediss", "unix":
		o, err := redis.ParseURL(raw)
		if err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		o.ContextTimeoutEnabled = true
		return redis.NewClient(o), nil
	case "redis+cluster", "rediss+cluster":
		u, err := clusterURL(strings.TrimSuffix(scheme, "+cluster"), rest)
		if err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		o, err := redis.ParseClusterURL(u)
		if err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		o.ContextTimeoutEnabled = true
		return redis.NewClusterClient(o), nil
	}
	return nil, fmt.Errorf("redis: unknown scheme %q: want redis, rediss, unix, redis+cluster or rediss+cluster", scheme)
}

// clusterURL rewrites [user:password@]host:port,host:port[?options] as the
// URL go-redis's ParseClusterURL reads: the first host, the others as addr
// options.
func clusterURL(scheme, rest string) (string, error) {
	rest, rawQuery, _ := strings.Cut(rest, "?")
	authority, path, _ := strings.Cut(rest, "/")
	if path != "" {
		return "", errors.New("a Redis Cluster has no databases: remove the path from redis+cluster://host:port,host:port")
	}
	user := ""
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		user, authority = authority[:i+1], authority[i+1:]
	}
	hosts := strings.Split(authority, ",")
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return "", fmt.Errorf("options: %w", err)
	}
	for _, h := range hosts {
		if h == "" {
			return "", errors.New("empty host in redis+cluster URL")
		}
	}
	for _, h := range hosts[1:] {
		q.Add("addr", h)
	}
	u := scheme + "://" + user + hosts[0]
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u, nil
}
