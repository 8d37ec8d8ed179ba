package idem_test

import (
	"context"
	"strings"
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
		{name: "no keys", line: "ACL SETUSER x on >PASSWORD ~other:* &idem:* +@all -@dangerous", errs: []string{"keys under idem:*"}},
		{name: "read only", line: "ACL SETUSER x on >PASSWORD %R~idem:* &idem:* +@all -@dangerous", errs: []string{"read and write keys under idem:*"}},
		{name: "no eval", line: base + " -eval", errs: []string{"may not run EVAL"}},
		{name: "no evalsha", line: base + " -evalsha", errs: []string{"may not run EVALSHA"}},
		{name: "no pexpire", line: base + " -pexpire", errs: []string{"may not run PEXPIRE in a script"}},
		{name: "no wait", line: base + " -wait", opts: []idem.RedisOption{idem.WithReplicaAck(1, time.Second)}, errs: []string{"WAIT"}},
		{name: "no wait, no acks", line: base + " -wait"},
		{name: "no channels", line: "ACL SETUSER x on >PASSWORD ~idem:* resetchannels +@all -@dangerous", warning: "waiters will poll"},
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
// as managed services do, passes Check with a warning.
func TestCheckWithoutConfig(t *testing.T) {
	srv := redistest.Start(t, redistest.WithArgs("--rename-command", "CONFIG", ""))
	log, records := recordingLogger()
	require.NoError(t, idem.NewRedisStore(srv.Client(t), idem.WithStoreLogger(log)).Check(context.Background()))
	require.Contains(t, records(), "event=eviction_unverified")
	require.NotContains(t, records(), "event=version_unverified", "INFO is there")
}

// TestCheckEveryMaster: on Redis Cluster, Check probes each master with a
// key that master serves; a master whose user may not touch the prefix is
// named.
func TestCheckEveryMaster(t *testing.T) {
	cl := redistest.SharedCluster(t)
	nodes := cl.Nodes()
	ctx := context.Background()
	line := docACLLines(t)[0]
	for _, n := range nodes[:len(nodes)-1] {
		aclUser(t, line, "idem", n.Client(t))
	}
	last := nodes[len(nodes)-1]
	aclUser(t, strings.ReplaceAll(line, "~idem:*", "~other:*"), "idem", last.Client(t))
	o := cl.Options()
	o.Username, o.Password = strings.ReplaceAll(t.Name(), "/", "-"), "pw"
	c := redis.NewClusterClient(o)
	t.Cleanup(func() { c.Close() })

	log, _ := recordingLogger()
	err := idem.NewRedisStore(c, idem.WithStoreLogger(log)).Check(ctx)
	require.Error(t, err)
	require.Contains(t, err.Error(), last.Addr())
	require.Contains(t, err.Error(), "keys under idem:*")
	for _, n := range nodes[:len(nodes)-1] {
		require.NotContains(t, err.Error(), n.Addr(), "the other masters pass")
	}
}
