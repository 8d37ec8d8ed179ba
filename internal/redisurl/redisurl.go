// Package redisurl makes a Redis client from a URL, for the idem command
// and the Caddy module: one server (redis://, rediss://, unix://), a
// master found through Sentinels (redis+sentinel://, rediss+sentinel://) or
// a Redis Cluster (redis+cluster://, rediss+cluster://):
//
//	redis://[user:password@]host[:port][/db][?option=value...]
//	redis+sentinel://[user:password@]host[:port][,host[:port]...]/master[/db][?option=value...]
//	redis+cluster://[user:password@]host[:port][,host[:port]...][?option=value...]
//
// For Sentinel, the hosts are the Sentinels (default port 26379), master is
// the monitored master's name, and user and password are the data nodes';
// the options sentinel_username and sentinel_password authenticate to the
// Sentinels. For Redis Cluster, the hosts are any of its nodes (default
// port 6379). The options are go-redis's URL options (dial_timeout=3s,
// read_timeout=5s, pool_size=20, ...). Every client honours the deadlines
// of its calls' contexts (ContextTimeoutEnabled), and a TLS connection's
// handshake is bounded by the dial timeout.
package redisurl

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Options adjust the clients Client makes.
type Options struct {
	// Roots are the CAs a TLS URL trusts instead of the system's (nil: the
	// system's, which SSL_CERT_FILE names on Unix).
	Roots *x509.CertPool
	// DialTimeout is the dial timeout unless the URL's dial_timeout sets
	// it; 0 keeps go-redis's (5s).
	DialTimeout time.Duration
	// DialerRetries is the dial attempts unless the URL's dialer_retries
	// sets them; 0 keeps go-redis's.
	DialerRetries int
}

// Client returns a client for the URL raw (see the package documentation)
// and a description of where it points, without credentials. It does no
// I/O.
func Client(raw string, o Options) (redis.UniversalClient, string, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, "", fmt.Errorf("%q is not a URL: want redis://host:port, redis+sentinel://host:port/master or redis+cluster://host:port", raw)
	}
	switch scheme {
	case "redis", "rediss", "unix":
		opts, err := redis.ParseURL(raw)
		if err != nil {
			return nil, "", err
		}
		q := url.Values{}
		if u, err := url.Parse(raw); err == nil {
			q = u.Query()
		}
		opts.ContextTimeoutEnabled = true
		opts.DialTimeout, opts.DialerRetries = o.dialDefaults(q, opts.DialTimeout, opts.DialerRetries)
		opts.Dialer = secure(opts.TLSConfig, o.Roots, opts.DialTimeout)
		return redis.NewClient(opts), opts.Addr, nil
	case "redis+sentinel", "rediss+sentinel":
		return sentinelClient(strings.TrimSuffix(scheme, "+sentinel"), rest, o)
	case "redis+cluster", "rediss+cluster":
		return clusterClient(strings.TrimSuffix(scheme, "+cluster"), rest, o)
	}
	return nil, "", fmt.Errorf("unknown scheme %q: want redis, rediss, unix, redis+sentinel, rediss+sentinel, redis+cluster or rediss+cluster", scheme)
}

// TLS reports whether the URL raw uses TLS.
func TLS(raw string) bool {
	scheme, _, _ := strings.Cut(raw, "://")
	return scheme == "rediss" || strings.HasPrefix(scheme, "rediss+")
}

// LoadCACert reads the PEM certificates of file into a pool.
func LoadCACert(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("no PEM certificate in %s", file)
	}
	return pool, nil
}

// defaultDialTimeout is go-redis's dial timeout, which a URL's options
// leave at 0 for the client to fill in: the TLS dialer needs it before.
const defaultDialTimeout = 5 * time.Second

// dialDefaults returns the dial timeout and attempts to use: o's, unless
// the URL's options set them or o leaves them at 0.
func (o Options) dialDefaults(query url.Values, timeout time.Duration, retries int) (time.Duration, int) {
	if o.DialTimeout > 0 && !query.Has("dial_timeout") {
		timeout = o.DialTimeout
	}
	if timeout <= 0 {
		timeout = defaultDialTimeout
	}
	if o.DialerRetries > 0 && !query.Has("dialer_retries") {
		retries = o.DialerRetries
	}
	return timeout, retries
}

// secure makes a URL's client trust roots instead of the system's
// certificates (roots nil: the system's), and returns the dialer that
// client uses: nil without TLS.
func secure(tc *tls.Config, roots *x509.CertPool, timeout time.Duration) func(context.Context, string, string) (net.Conn, error) {
	if tc == nil {
		return nil
	}
	if roots != nil {
		tc.RootCAs = roots
	}
	return tlsDialer(tc, timeout)
}

// tlsDialer returns a dialer that connects and then runs the TLS handshake,
// both bounded by timeout and ctx (go-redis's own TLS dial ignores ctx), and
// says which of the two failed.
func tlsDialer(tc *tls.Config, timeout time.Duration) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		raw, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cfg := tc
		if cfg.ServerName == "" {
			cfg = tc.Clone()
			cfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		conn := tls.Client(raw, cfg)
		if err := conn.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, fmt.Errorf("TLS handshake: %w", err)
		}
		return conn, nil
	}
}
