package redisurl_test

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/internal/redisurl"
)

// TestClient: each kind of URL makes its kind of client, with the options
// of the URL, deadlines honoured and no credentials in the target.
func TestClient(t *testing.T) {
	tests := []struct {
		url    string
		target string
		check  func(t *testing.T, c redis.UniversalClient)
	}{
		{"redis://u:p@10.0.0.1:6380/3?read_timeout=7s", "10.0.0.1:6380", func(t *testing.T, c redis.UniversalClient) {
			o := c.(*redis.Client).Options()
			require.Equal(t, []any{"u", "p", 3, 7 * time.Second, 5 * time.Second, true},
				[]any{o.Username, o.Password, o.DB, o.ReadTimeout, o.DialTimeout, o.ContextTimeoutEnabled})
		}},
		{"unix:///run/redis.sock", "/run/redis.sock", nil},
		{"redis+cluster://u:p@h1,h2:7001,[::1]:7002?dial_timeout=1s", "cluster h1:6379,h2:7001,[::1]:7002", func(t *testing.T, c redis.UniversalClient) {
			o := c.(*redis.ClusterClient).Options()
			require.Equal(t, []string{"h1:6379", "h2:7001", "[::1]:7002"}, o.Addrs)
			require.Equal(t, []any{"u", "p", time.Second, true}, []any{o.Username, o.Password, o.DialTimeout, o.ContextTimeoutEnabled})
		}},
		{"redis+sentinel://u:p@s1,s2:26380/mymaster/2?sentinel_password=sp", `master "mymaster" via Sentinel s1:26379,s2:26380`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			c, target, err := redisurl.Client(tt.url, redisurl.Options{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			require.Equal(t, tt.target, target)
			require.NotContains(t, target, "p@", "no credentials in messages")
			if tt.check != nil {
				tt.check(t, c)
			}
		})
	}
}

// TestClientDialDefaults: Options' dial timeout and attempts apply unless
// the URL sets them.
func TestClientDialDefaults(t *testing.T) {
	o := redisurl.Options{DialTimeout: 3 * time.Second, DialerRetries: 1}
	c, _, err := redisurl.Client("redis://h:6379", o)
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, 3*time.Second, c.(*redis.Client).Options().DialTimeout)
	require.Equal(t, 1, c.(*redis.Client).Options().DialerRetries)
	c, _, err = redisurl.Client("redis+cluster://h1,h2?dial_timeout=9s&dialer_retries=4", o)
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, 9*time.Second, c.(*redis.ClusterClient).Options().DialTimeout)
	require.Equal(t, 4, c.(*redis.ClusterClient).Options().DialerRetries)
}

// TestClientRefused: the URLs that name no usable deployment are refused
// with what is wrong.
func TestClientRefused(t *testing.T) {
	for url, want := range map[string]string{
		"localhost:6379":                  `"localhost:6379" is not a URL`,
		"memcache://h":                    `unknown scheme "memcache"`,
		"redis+sentinel://s1,s2":          "names the master after the hosts",
		"redis+sentinel://s1/m/0/x":       "names the master after the hosts",
		"redis+cluster://h1,h2/0":         "a Redis Cluster has no databases",
		"redis+cluster://h1,,h2":          "empty host",
		"redis+cluster://h1?dial_timeout": "",
	} {
		t.Run(url, func(t *testing.T) {
			c, _, err := redisurl.Client(url, redisurl.Options{})
			if want == "" {
				if err == nil {
					c.Close()
				}
				return // go-redis decides
			}
			require.ErrorContains(t, err, want)
		})
	}
}

func TestTLS(t *testing.T) {
	for url, want := range map[string]bool{"rediss://h": true, "rediss+sentinel://s/m": true, "rediss+cluster://h": true,
		"redis://h": false, "redis+cluster://h": false, "unix:///s": false} {
		require.Equal(t, want, redisurl.TLS(url), url)
	}
}

// TestClientRoots: the CAs of Options reach every kind of TLS client, with
// a dialer that bounds the handshake.
func TestClientRoots(t *testing.T) {
	roots, err := redisurl.LoadCACert(redistest.NewCA(t).File)
	require.NoError(t, err)
	for _, url := range []string{"rediss://h:6379", "rediss+sentinel://s1,s2/mymaster", "rediss+cluster://h1,h2"} {
		t.Run(url, func(t *testing.T) {
			c, _, err := redisurl.Client(url, redisurl.Options{Roots: roots})
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			var tc *tls.Config
			var dialer any
			switch c := c.(type) {
			case *redis.Client:
				tc, dialer = c.Options().TLSConfig, c.Options().Dialer
			case *redis.ClusterClient:
				tc, dialer = c.Options().TLSConfig, c.Options().Dialer
			}
			require.NotNil(t, tc)
			require.Same(t, roots, tc.RootCAs)
			require.NotNil(t, dialer)
		})
	}
}

// TestClientTLS: a TLS client connects to a server whose CA it trusts, with
// go-redis's dial timeout when neither the URL nor Options set one (the TLS
// dialer is bounded by it).
func TestClientTLS(t *testing.T) {
	ca := redistest.NewCA(t)
	srv := redistest.StartTLS(t, ca)
	roots, err := redisurl.LoadCACert(ca.File)
	require.NoError(t, err)
	for _, url := range []string{"rediss://" + srv.Addr(), "rediss://" + srv.Addr() + "?dial_timeout=2s"} {
		t.Run(url, func(t *testing.T) {
			c, _, err := redisurl.Client(url, redisurl.Options{Roots: roots})
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			require.NoError(t, c.Ping(t.Context()).Err())
		})
	}
}

func TestLoadCACert(t *testing.T) {
	dir := t.TempDir()
	_, err := redisurl.LoadCACert(filepath.Join(dir, "missing.pem"))
	require.ErrorIs(t, err, os.ErrNotExist)
	bad := filepath.Join(dir, "bad.pem")
	require.NoError(t, os.WriteFile(bad, []byte("not a certificate"), 0o600))
	_, err = redisurl.LoadCACert(bad)
	require.ErrorContains(t, err, "no PEM certificate in "+bad)
}
