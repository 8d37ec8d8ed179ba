package redisurl

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"
)

// multiHostURL is a URL whose host part lists several hosts, which net/url
// does not parse.
type multiHostURL struct {
	user  *url.Userinfo
	hosts []string // with ports
	path  []string // the path's segments
	query url.Values
}

func parseMultiHost(rest, defaultPort string) (*multiHostURL, error) {
	u := &multiHostURL{}
	rest, rawQuery, _ := strings.Cut(rest, "?")
	authority, path, _ := strings.Cut(rest, "/")
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		parsed, err := url.Parse("redis://" + authority[:i+1] + "localhost")
		if err != nil {
			return nil, errors.New("unreadable user or password")
		}
		u.user, authority = parsed.User, authority[i+1:]
	}
	for h := range strings.SplitSeq(authority, ",") {
		if h == "" {
			return nil, errors.New("empty host")
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(strings.Trim(h, "[]"), defaultPort)
		}
		u.hosts = append(u.hosts, h)
	}
	for s := range strings.SplitSeq(path, "/") {
		if s != "" {
			u.path = append(u.path, s)
		}
	}
	var err error
	if u.query, err = url.ParseQuery(rawQuery); err != nil {
		return nil, fmt.Errorf("options: %w", err)
	}
	return u, nil
}

// goRedisURL returns the URL go-redis parses: the first host, others as
// addr options.
func (u *multiHostURL) goRedisURL(scheme string, user *url.Userinfo, path string) string {
	q := url.Values{}
	for k, v := range u.query {
		q[k] = v
	}
	for _, h := range u.hosts[1:] {
		q.Add("addr", h)
	}
	g := url.URL{Scheme: scheme, User: user, Host: u.hosts[0], Path: path, RawQuery: q.Encode()}
	return g.String()
}

// sentinelClient returns a failover client for
// [user:password@]host:port,.../master[/db][?options].
func sentinelClient(scheme, rest string, o Options) (redis.UniversalClient, string, error) {
	u, err := parseMultiHost(rest, "26379")
	if err != nil {
		return nil, "", err
	}
	if len(u.path) == 0 || len(u.path) > 2 {
		return nil, "", errors.New("a Sentinel URL names the master after the hosts: redis+sentinel://host:port,host:port/master[/db]")
	}
	master := u.path[0]
	// go-redis takes the Sentinels' credentials from the user part and the
	// data nodes' from options; this URL has them the other way round,
	// like redis:// where the user part is the data node's.
	var sentinelUser *url.Userinfo
	if p, ok := u.query["sentinel_password"]; ok {
		sentinelUser = url.UserPassword(u.query.Get("sentinel_username"), p[0])
	} else if n := u.query.Get("sentinel_username"); n != "" {
		sentinelUser = url.User(n)
	}
	u.query.Del("sentinel_username")
	u.query.Del("sentinel_password")
	if u.user != nil {
		u.query.Set("username", u.user.Username())
		if p, ok := u.user.Password(); ok {
			u.query.Set("password", p)
		}
	}
	u.query.Set("master_name", master)
	path := ""
	if len(u.path) == 2 {
		path = "/" + u.path[1]
	}
	opts, err := redis.ParseFailoverURL(u.goRedisURL(scheme, sentinelUser, path))
	if err != nil {
		return nil, "", err
	}
	opts.ContextTimeoutEnabled = true
	opts.DialTimeout, opts.DialerRetries = o.dialDefaults(u.query, opts.DialTimeout, opts.DialerRetries)
	opts.Dialer = secure(opts.TLSConfig, o.Roots, opts.DialTimeout)
	return redis.NewFailoverClient(opts), fmt.Sprintf("master %q via Sentinel %s", master, strings.Join(u.hosts, ",")), nil
}

// clusterClient returns a cluster client for
// [user:password@]host:port,...[?options].
func clusterClient(scheme, rest string, o Options) (redis.UniversalClient, string, error) {
	u, err := parseMultiHost(rest, "6379")
	if err != nil {
		return nil, "", err
	}
	if len(u.path) > 0 {
		return nil, "", errors.New("a Redis Cluster has no databases: remove the path from redis+cluster://host:port,host:port")
	}
	opts, err := redis.ParseClusterURL(u.goRedisURL(scheme, u.user, ""))
	if err != nil {
		return nil, "", err
	}
	opts.ContextTimeoutEnabled = true
	opts.DialTimeout, opts.DialerRetries = o.dialDefaults(u.query, opts.DialTimeout, opts.DialerRetries)
	opts.Dialer = secure(opts.TLSConfig, o.Roots, opts.DialTimeout)
	return redis.NewClusterClient(opts), "cluster " + strings.Join(u.hosts, ","), nil
}
