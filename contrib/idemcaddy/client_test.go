package idemcaddy_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/contrib/idemcaddy"
	"github.com/idemkit/idem/internal/redistest"
)

// clientIDs returns the ids of the connections Redis has from others than
// admin, the test's own client.
func clientIDs(t *testing.T, admin *redis.Client) []string {
	t.Helper()
	ctx := context.Background()
	self, err := admin.ClientID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	list, err := admin.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for line := range strings.Lines(list) {
		id, _, _ := strings.Cut(strings.TrimPrefix(line, "id="), " ")
		if id != fmt.Sprint(self) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// Reloads keep the one Redis client of a URL and its connections; the
// configuration that drops the module closes it.
func TestReloadSharesClient(t *testing.T) {
	rs, u := redisServer(t), newUpstream(t)
	admin := rs.Client(t)
	url := redisURL(rs)

	load(t, proxied("redis "+url+"\nwait 1s", u))
	for i := range 3 {
		post(t, "/payments", "{}", "Idempotency-Key", fmt.Sprint("before-", i))
	}
	before := clientIDs(t, admin)
	if len(before) == 0 {
		t.Fatal("no connection from Caddy")
	}
	for i := range 5 {
		// Each reload changes the configuration, so Caddy replaces it.
		load(t, proxied(fmt.Sprintf("redis %s\nwait %ds", url, i+2), u))
		for j := range 3 {
			if r := post(t, "/payments", "{}", "Idempotency-Key", fmt.Sprint("reload-", i, "-", j)); r.status != 201 {
				t.Fatalf("after reload %d: %d %s", i, r.status, r.body)
			}
		}
		if users := idemcaddy.ClientUsers(url, ""); users != 1 {
			t.Errorf("after reload %d: %d users of the client, want 1", i, users)
		}
	}
	if after := clientIDs(t, admin); !slices.Equal(after, before) {
		t.Errorf("connections after 5 reloads %v, want the ones before %v", after, before)
	}

	t.Setenv("IDEMCADDY_TEST_REDIS", url) // the same client, by a placeholder
	load(t, proxied("redis {env.IDEMCADDY_TEST_REDIS}", u))
	if r := post(t, "/payments", "{}", "Idempotency-Key", "by-env"); r.status != 201 || idemcaddy.ClientUsers(url, "") != 1 {
		t.Errorf("redis {env.…}: %d %s, %d users of the client", r.status, r.body, idemcaddy.ClientUsers(url, ""))
	}
	if after := clientIDs(t, admin); !slices.Equal(after, before) {
		t.Errorf("connections with {env.…} %v, want the ones before %v", after, before)
	}

	load(t, rawSite("respond 204"))
	if users := idemcaddy.ClientUsers(url, ""); users != 0 {
		t.Errorf("without the module: %d users of the client, want 0", users)
	}
	var left []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if left = clientIDs(t, admin); len(left) == 0 {
			break
		}
	}
	if len(left) != 0 {
		t.Errorf("connections left after the module was unloaded: %v", left)
	}
}

// The URL forms newClient takes, and the ones it refuses.
func TestRedisURL(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"redis://127.0.0.1:6379/2?dial_timeout=1s", "Addr=127.0.0.1:6379 DB=2"},
		{"rediss://user:pw@example.com:6380", "Addr=example.com:6380 TLS"},
		{"unix:///run/redis.sock", "Addr=/run/redis.sock"},
		{"redis+cluster://a:7000,b:7001,c:7002?read_timeout=1s", "cluster a:7000,b:7001,c:7002"},
		{"rediss+cluster://u:p@a:7000", "cluster a:7000 TLS"},
		{"redis+sentinel://s1,s2:26380/mymaster/2", "Addr=FailoverClient DB=2"},
	} {
		c, err := idemcaddy.NewClient(tc.url, "")
		if err != nil {
			t.Errorf("%s: %v", tc.url, err)
			continue
		}
		got := ""
		switch c := c.(type) {
		case *redis.Client:
			o := c.Options()
			got = fmt.Sprintf("Addr=%s", o.Addr)
			if o.DB != 0 {
				got += fmt.Sprintf(" DB=%d", o.DB)
			}
			if o.TLSConfig != nil {
				got += " TLS"
			}
			if !o.ContextTimeoutEnabled {
				t.Errorf("%s: ContextTimeoutEnabled not set", tc.url)
			}
		case *redis.ClusterClient:
			o := c.Options()
			got = "cluster " + strings.Join(o.Addrs, ",")
			if o.TLSConfig != nil {
				got += " TLS"
			}
			if !o.ContextTimeoutEnabled {
				t.Errorf("%s: ContextTimeoutEnabled not set", tc.url)
			}
		}
		_ = c.Close()
		if got != tc.want {
			t.Errorf("%s: %s, want %s", tc.url, got, tc.want)
		}
	}
	for _, bad := range []string{"127.0.0.1:6379", "http://h:1", "redis://h:1?bogus=1", "redis+cluster://a:1,,b:2", "redis+cluster://a:1/0",
		"redis+sentinel://s1,s2"} {
		if c, err := idemcaddy.NewClient(bad, ""); err == nil {
			_ = c.Close()
			t.Errorf("%s: no error", bad)
		}
	}
	// ca_cert: the CA a TLS URL trusts; refused for a URL without TLS and
	// for a file without a certificate.
	ca := redistest.NewCA(t)
	c, err := idemcaddy.NewClient("rediss://h:6380", ca.File)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.(*redis.Client).Options().TLSConfig.RootCAs; got == nil || !got.Equal(ca.Pool) {
		t.Errorf("ca_cert: the client trusts %v, not the CA", got)
	}
	_ = c.Close()
	if _, err := idemcaddy.NewClient("redis://h:6379", ca.File); err == nil || !strings.Contains(err.Error(), "ca_cert applies to TLS URLs only") {
		t.Errorf("ca_cert with redis://: %v", err)
	}
	if _, err := idemcaddy.NewClient("rediss://h:6379", "/nonexistent.pem"); err == nil || !strings.Contains(err.Error(), "ca_cert:") {
		t.Errorf("ca_cert without a file: %v", err)
	}
}
