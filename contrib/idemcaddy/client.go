package idemcaddy

import (
	"crypto/x509"
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/internal/redisurl"
)

// clients holds one Redis client per redis URL and CA file, shared by
// every handler that names them, in this configuration and the next: a
// reload provisions the new configuration (one more user) before it cleans
// up the old one (one fewer), so the client and its connections outlive
// the reload. The last user's Cleanup closes it.
var clients = caddy.NewUsagePool()

// sharedClient is a pooled Redis client.
type sharedClient struct {
	redis.UniversalClient
}

// Destruct implements caddy.Destructor: the last user is gone.
func (c sharedClient) Destruct() error { return c.Close() }

// clientKey names the client of a redis URL and a CA file ("" for the
// system's CAs) in clients.
func clientKey(url, caCert string) string { return url + "\x00" + caCert }

// loadClient returns the client for url and caCert, making it on first
// use. Every call that succeeds must be matched by releaseClient with the
// same arguments.
func loadClient(url, caCert string) (redis.UniversalClient, error) {
	v, _, err := clients.LoadOrNew(clientKey(url, caCert), func() (caddy.Destructor, error) {
		c, err := newClient(url, caCert)
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

// releaseClient gives up one use of the client of url and caCert.
func releaseClient(url, caCert string) error {
	_, err := clients.Delete(clientKey(url, caCert))
	return err
}

// newClient returns a client for a redis URL, as the idem command takes
// them (internal/redisurl): redis://, rediss:// and unix:// as go-redis
// parses them (options such as dial_timeout, read_timeout and pool_size in
// the query), a master through its Sentinels as
// redis+sentinel://host:port,host:port/master[/db], or a Redis Cluster as
// redis+cluster://host:port,host:port (rediss+… for TLS). With caCert, the
// PEM file of a CA, a TLS URL trusts that CA instead of the system's.
// Deadlines of request contexts are honoured. It does no I/O but reading
// caCert.
func newClient(url, caCert string) (redis.UniversalClient, error) {
	var roots *x509.CertPool
	if caCert != "" {
		if !redisurl.TLS(url) {
			return nil, fmt.Errorf("ca_cert applies to TLS URLs only (rediss://, rediss+sentinel://, rediss+cluster://)")
		}
		var err error
		if roots, err = redisurl.LoadCACert(caCert); err != nil {
			return nil, fmt.Errorf("ca_cert: %w", err)
		}
	}
	c, _, err := redisurl.Client(url, redisurl.Options{Roots: roots})
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	return c, nil
}
