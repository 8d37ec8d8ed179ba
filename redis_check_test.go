package idem_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redistest"
)

// TestCheckProbes: Check names each permission the Redis user lacks, as an
// error when idem cannot work without it and as a warning when it only
// degrades, and leaves no key behind.
func TestCheckProbes(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	const base = "ACL SETUSER x on >PASSWORD ~idem:* &idem:* +@all -@dangerous"
	for _, tc := range []struct {
		name    string
		line    string
		opts    []idem.RedisOption
		errs    []string // in Check's error; none: Check passes
		warning string   // in the log
	}{
		{name: "no keys", line: "ACL SETUSER x on >PASSWORD ~other:* &idem:* +@all -@dangerous", errs: []string{"may not read keys under idem:*"}},
		{name: "read only", line: "ACL SETUSER x on >PASSWORD %R~idem:* &idem:* +@all -@dangerous", errs: []string{"read and write keys under idem:*"}},
		{name: "no eval", line: base + " -eval", errs: []string{"may not run EVAL"}},
		{name: "no evalsha", line: base + " -evalsha", errs: []string{"may not run EVALSHA"}},
		{name: "no pexpire", line: base + " -pexpire", errs: []string{"may not run PEXPIRE in a script"}},
		{name: "no wait", line: base + " -wait", opts: []idem.RedisOption{idem.WithReplicaAck(1, time.Second)}, errs: []string{"WAIT"}},
		{name: "no wait, no acks", line: base + " -wait"},
		{name: "no channels", line: "ACL SETUSER x on >PASSWORD ~idem:* resetchannels +@all -@dangerous", warning: "may not publish on the channels idem:*"},
		{name: "no ssubscribe", line: base + " -ssubscribe", warning: "may not subscribe"},
		{name: "no info", line: base, warning: "event=version_unverified"},
		{name: "everything", line: "ACL SETUSER x on >PASSWORD ~* &* +@all"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := userClient(t, srv, aclUser(t, tc.line, "idem", admin))
			log, records := recordingLogger()
			err := idem.NewRedisStore(c, append(tc.opts, idem.WithStoreLogger(log))...).Check(ctx)
			if len(tc.errs) == 0 {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
				require.Contains(t, err.Error(), srv.Addr(), "the message names the server")
				for _, e := range tc.errs {
					require.Contains(t, err.Error(), e)
				}
			}
			if tc.warning != "" {
				require.Contains(t, records(), tc.warning)
			}
			n, err := admin.DBSize(ctx).Result()
			require.NoError(t, err)
			require.Zero(t, n, "Check leaves nothing behind")
		})
	}
}

// TestCheckWithoutConfig: a server whose CONFIG command is renamed away,
// as managed services do, passes Check: INFO gives the version and the
// eviction policy, whose risk is still told.
func TestCheckWithoutConfig(t *testing.T) {
	for _, tc := range []struct {
		name    string
		policy  string
		warning string // in the log; "": no warning
	}{
		{name: "noeviction", policy: "noeviction"},
		{name: "evicting", policy: "allkeys-lru", warning: "maxmemory-policy=allkeys-lru"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t, redistest.WithArgs("--maxmemory-policy", tc.policy), redistest.WithoutCommands("CONFIG"))
			log, records := recordingLogger()
			require.NoError(t, idem.NewRedisStore(srv.Client(t), idem.WithStoreLogger(log)).Check(context.Background()))
			if tc.warning == "" {
				require.Empty(t, records())
			} else {
				require.Contains(t, records(), "event=eviction_policy")
				require.Contains(t, records(), tc.warning)
				require.Equal(t, 1, strings.Count(records(), "\n"), "one warning:\n%s", records())
			}
		})
	}
}

// commandCounter is a go-redis hook that counts the commands a client
// sends by name and lets edit change a reply.
type commandCounter struct {
	mu   sync.Mutex
	n    map[string]int
	edit func(redis.Cmder)
}

func (h *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		if h.n == nil {
			h.n = map[string]int{}
		}
		h.n[cmd.Name()]++
		h.mu.Unlock()
		err := next(ctx, cmd)
		if h.edit != nil {
			h.edit(cmd)
		}
		return err
	}
}

func (h *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *commandCounter) count(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[name]
}

// TestCheckEvictionPolicy: Check reads the eviction policy from INFO and
// sends CONFIG GET only when INFO does not give it: refused, or a reply
// without maxmemory_policy (a proxy's).
func TestCheckEvictionPolicy(t *testing.T) {
	srv := redistest.Start(t, redistest.WithArgs("--maxmemory-policy", "volatile-lru"))
	admin := srv.Client(t)
	ctx := context.Background()
	stripPolicy := func(cmd redis.Cmder) {
		if c, ok := cmd.(*redis.StringCmd); ok && cmd.Name() == "info" && c.Err() == nil {
			c.SetVal(strings.ReplaceAll(c.Val(), "maxmemory_policy:", "other_field:"))
		}
	}
	for _, tc := range []struct {
		name     string
		line     string // the user's ACL; "": the default user
		edit     func(redis.Cmder)
		configs  int      // CONFIG commands sent
		warnings []string // in the log
	}{
		{name: "from INFO", warnings: []string{"event=eviction_policy"}},
		{name: "INFO without the policy", edit: stripPolicy, configs: 1, warnings: []string{"event=eviction_policy"}},
		{name: "INFO refused", line: "ACL SETUSER x on >PASSWORD ~idem:* &idem:* +@all -info", configs: 1,
			warnings: []string{"event=version_unverified", "event=eviction_policy"}},
		{name: "INFO and CONFIG refused", line: "ACL SETUSER x on >PASSWORD ~idem:* &idem:* +@all -info -config", configs: 1,
			warnings: []string{"event=version_unverified", "event=eviction_unverified"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := srv.Client(t)
			if tc.line != "" {
				c = userClient(t, srv, aclUser(t, tc.line, "idem", admin))
			}
			hook := &commandCounter{edit: tc.edit}
			c.AddHook(hook)
			log, records := recordingLogger()
			require.NoError(t, idem.NewRedisStore(c, idem.WithStoreLogger(log)).Check(ctx))
			require.Equal(t, tc.configs, hook.count("config"), "CONFIG sent")
			require.Equal(t, len(tc.warnings), strings.Count(records(), "\n"), records())
			for _, w := range tc.warnings {
				require.Contains(t, records(), w)
			}
			if slices.Contains(tc.warnings, "event=eviction_policy") {
				require.Contains(t, records(), "maxmemory-policy=volatile-lru")
			}
		})
	}
}

// TestCheckEveryMaster: on Redis Cluster, Check probes each master with a
// key that master serves; a master whose user may not touch the prefix is
// named.
func TestCheckEveryMaster(t *testing.T) {
	cl := redistest.SharedCluster(t)
	nodes := cl.Nodes()
	ctx := context.Background()
	line := docACLLines(t)[0]
	var user string
	for _, n := range nodes {
		user = aclUser(t, line, "idem", n.Client(t))
	}
	o := cl.Options()
	o.Username, o.Password = user, "pw"
	c := redis.NewClusterClient(o)
	t.Cleanup(func() { c.Close() })
	log, _ := recordingLogger()
	require.NoError(t, idem.NewRedisStore(c, idem.WithStoreLogger(log)).Check(ctx),
		"each master is probed with a key it serves, which the user may touch")

	last := nodes[len(nodes)-1]
	require.NoError(t, last.Client(t).Do(ctx, "ACL", "DELUSER", user).Err())
	aclUser(t, strings.ReplaceAll(line, "~idem:*", "~other:*"), "idem", last.Client(t))
	err := idem.NewRedisStore(c, idem.WithStoreLogger(log)).Check(ctx)
	require.Error(t, err)
	require.Contains(t, err.Error(), last.Addr())
	require.Contains(t, err.Error(), "keys under idem:*")
	for _, n := range nodes[:len(nodes)-1] {
		require.NotContains(t, err.Error(), n.Addr(), "the other masters pass")
	}
}

// TestCheckAuthentication: a client whose credentials the server refuses
// (a wrong password, no password where one is needed, a disabled user) is
// told so once, naming the user, as ErrStoreUnavailable, with no warning
// logged and no missing permission reported.
func TestCheckAuthentication(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all").Err())
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "gone", "off", ">pw", "~*", "&*", "+@all").Err())
	// A second server whose default user needs a password.
	locked := redistest.Start(t)
	require.NoError(t, locked.Client(t).Do(ctx, "ACL", "SETUSER", "default", "resetpass", ">secret").Err())

	for _, tc := range []struct {
		name       string
		srv        *redistest.Server
		user, pass string
		want       string // the user named
		reply      string // the server's reply, quoted
	}{
		{name: "wrong password", srv: srv, user: "app", pass: "nope", want: `user "app"`, reply: "WRONGPASS"},
		{name: "unknown user", srv: srv, user: "nobody", pass: "pw", want: `user "nobody"`, reply: "WRONGPASS"},
		{name: "disabled user", srv: srv, user: "gone", pass: "pw", want: `user "gone"`, reply: "WRONGPASS"},
		{name: "default user, wrong password", srv: locked, pass: "nope", want: `user "default"`, reply: "WRONGPASS"},
		{name: "no password", srv: locked, want: `user "default"`, reply: "NOAUTH"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.srv.Options()
			o.Username, o.Password = tc.user, tc.pass
			c := redis.NewClient(o)
			t.Cleanup(func() { c.Close() })
			log, records := recordingLogger()
			err := idem.NewRedisStore(c, idem.WithStoreLogger(log)).Check(ctx)
			require.ErrorIs(t, err, idem.ErrStoreUnavailable)
			msg := err.Error()
			t.Log(msg)
			require.Contains(t, msg, "authentication failed")
			require.Contains(t, msg, tc.want)
			require.Contains(t, msg, tc.srv.Addr(), "the message names the server")
			require.Contains(t, msg, tc.reply)
			require.Equal(t, 1, strings.Count(msg, tc.reply), "said once: %s", msg)
			require.NotContains(t, msg, "may not", "not a missing permission: %s", msg)
			require.Empty(t, records(), "no warning logged")
		})
	}
}

// TestCheckAuthenticationCluster: on Redis Cluster, credentials the nodes
// refuse are one error naming the user, as on a single server.
func TestCheckAuthenticationCluster(t *testing.T) {
	o := redistest.SharedCluster(t).Options()
	o.Username, o.Password = "nobody", "nope"
	c := redis.NewClusterClient(o)
	t.Cleanup(func() { c.Close() })
	log, records := recordingLogger()
	err := idem.NewRedisStore(c, idem.WithStoreLogger(log)).Check(context.Background())
	require.ErrorIs(t, err, idem.ErrStoreUnavailable)
	require.Contains(t, err.Error(), `authentication failed as user "nobody"`)
	require.Equal(t, 1, strings.Count(err.Error(), "WRONGPASS"), err.Error())
	require.Empty(t, records())
}
