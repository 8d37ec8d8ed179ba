package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/redistest"
)

// serverLine matches the line check prints for the server at addr: its
// name and version (Redis 7 or newer; Valkey, which also passes for Redis).
func serverLine(addr string) string {
	return `(?m)^` + regexp.QuoteMeta(addr) + `: (Redis [7-9]|Redis \d\d|Valkey \d+)\.`
}

// TestServerPrint: a server is named by its own name and version, and its
// mode read from server_mode when redis_mode is absent (Valkey 8).
func TestServerPrint(t *testing.T) {
	tests := []struct {
		name string
		info map[string]string
		want string
	}{
		{"Redis 7.0", map[string]string{"redis_version": "7.0.15", "redis_mode": "standalone", "role": "master"},
			"h:1: Redis 7.0.15, standalone, master\n"},
		{"Redis 7.4 cluster", map[string]string{"redis_version": "7.4.1", "redis_mode": "cluster", "role": "master"},
			"h:1: Redis 7.4.1, cluster, master\n"},
		{"Valkey 8 cluster", map[string]string{"redis_version": "7.2.4", "server_name": "valkey", "valkey_version": "8.0.1",
			"server_mode": "cluster", "role": "master"},
			"h:1: Valkey 8.0.1, cluster, master\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			s := &serverReport{name: "h:1", info: tt.info, save: "", persistence: "none"}
			s.print(&b)
			first, _, _ := bytes.Cut(b.Bytes(), []byte("\n"))
			require.Equal(t, tt.want, string(first)+"\n")
		})
	}
}

// TestCheckWithoutConfig: on a server without CONFIG (rename-command CONFIG
// "", as managed services do), check reads the eviction policy from INFO,
// prints what it could not read and how to verify it by hand, and exits 0.
func TestCheckWithoutConfig(t *testing.T) {
	srv := redistest.Start(t, redistest.WithoutCommands("CONFIG"))
	addr := srv.Addr()
	code, out, errOut := cli(t, "check", "-redis", "redis://"+addr)
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, serverLine(addr), out)
	for _, want := range []string{
		"maxmemory-policy noeviction",
		"persistence  AOF off, RDB snapshots not verified (CONFIG refused)",
		"warning: " + addr + ": CONFIG refused (ERR unknown command 'config'",
		"RDB snapshots not verified; verify by hand: CONFIG GET save as an admin user, or the provider's persistence settings",
		"ok: idem can use " + addr,
	} {
		require.Contains(t, out, want)
	}
	require.Empty(t, errOut)
}

// TestCheckWithoutInfo: for an ACL user that may not run INFO (nor CONFIG),
// check says that the version, eviction policy, persistence and replicas
// were not verified and how to verify them by hand, as warnings, not a
// failure.
func TestCheckWithoutInfo(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	require.NoError(t, srv.Client(t).Do(ctx, "ACL", "SETUSER", "u", "on", ">pw", "~idem:*", "&idem:*", "+@all", "-@dangerous").Err())
	addr := srv.Addr()
	code, out, errOut := cli(t, "check", "-redis", "redis://u:pw@"+addr)
	for _, want := range []string{
		addr + ": version, mode and role not verified (INFO refused)",
		"eviction     not verified (INFO refused)",
		"persistence  not verified (INFO and CONFIG refused)",
		"replicas     not verified (INFO refused)",
		"warning: " + addr + ": INFO refused (NOPERM",
		"server version, eviction policy, persistence and replicas not verified; verify by hand: " +
			"INFO server, memory, persistence and replication as an admin user, or the provider's console",
		"warning: " + addr + ": CONFIG refused (NOPERM",
	} {
		require.Contains(t, out, want)
	}

	require.Equal(t, 1, strings.Count(out, "INFO refused (NOPERM"), "one warning for the refused INFO:\n%s", out)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "ok: idem can use "+addr)
}

// TestCheckAuthentication: credentials the server refuses are one line
// saying that authentication failed and as which user, exit 1, and nothing
// reported as refused or not verified; the other commands say the same.
func TestCheckAuthentication(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	require.NoError(t, srv.Client(t).Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all").Err())
	addr := srv.Addr()
	for _, tc := range []struct {
		name string
		args []string
		user string
	}{
		{name: "check, wrong password", args: []string{"check", "-redis", "redis://app:nope@" + addr}, user: "app"},
		{name: "check, no such user", args: []string{"check", "-redis", "redis://nobody:pw@" + addr}, user: "nobody"},
		{name: "scan", args: []string{"scan", "-redis", "redis://app:nope@" + addr}, user: "app"},
		{name: "inspect", args: []string{"inspect", "-redis", "redis://app:nope@" + addr, "k"}, user: "app"},
		{name: "verify", args: []string{"verify", "-redis", "redis://app:nope@" + addr, "-duration", "1s"}, user: "app"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := cli(t, tc.args...)
			require.Equal(t, exitFail, code, out+errOut)
			require.Empty(t, out)
			require.Equal(t, 1, strings.Count(errOut, "\n"), errOut)
			require.Contains(t, errOut, "authentication failed as user \""+tc.user+"\"")
			require.Contains(t, errOut, addr)
			require.Equal(t, 1, strings.Count(errOut, "WRONGPASS"), errOut)
			require.NotContains(t, errOut, "refused")
		})
	}
}
