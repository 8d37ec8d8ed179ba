package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/redistest"
)

func TestCluster(t *testing.T) {
	cl := redistest.SharedCluster(t)
	url := "redis+cluster://" + strings.Join(cl.Addrs(), ",")
	s := seed(t, url, cl.Client(t))
	flags := []string{"-redis", url, "-prefix", s.prefix}

	require.Equal(t, "completed", inspectJSON(t, append(flags, "-kind", "http", "-scope", "tenant-1", "k-http")...).State)
	require.True(t, inspectJSON(t, append(flags, "running")...).Held)

	code, out, errOut := cli(t, append([]string{"scan", "-json"}, flags...)...)
	require.Equal(t, exitOK, code, errOut)
	var rep scanReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Equal(t, 3, rep.Servers, "every master")
	require.True(t, rep.Complete)
	require.Equal(t, map[string]int{"completed": 2, "in_progress": 1, "released": 1}, rep.States)

	code, out, errOut = cli(t, append([]string{"forget", "-yes"}, append(flags, "crashed")...)...)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "forgot")
	require.Equal(t, "absent", inspectJSON(t, append(flags, "crashed")...).State)

	code, out, errOut = cli(t, "check", "-redis", url)
	require.Equal(t, exitOK, code, errOut)
	for _, a := range cl.Addrs() {
		require.Regexp(t, serverLine(a), out)
	}
	require.Contains(t, out, ", cluster, master")
}

func TestSentinel(t *testing.T) {
	f := redistest.StartFailover(t)
	url := "redis+sentinel://" + strings.Join(f.SentinelAddrs(), ",") + "/" + f.MasterName()
	s := seed(t, url, f.Client(t))

	in := inspectJSON(t, "-redis", url, "-prefix", s.prefix, "paid")
	require.Equal(t, "completed", in.State)

	code, out, errOut := cli(t, "check", "-redis", url)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, `master "`+f.MasterName()+`" via Sentinel`)
	require.Contains(t, out, "replicas     2 (")
	require.Contains(t, out, "without idem.WithReplicaAck a failover can lose the last claims and results")

	code, _, errOut = cli(t, "inspect", "-redis", "redis+sentinel://"+strings.Join(f.SentinelAddrs(), ",")+"/nosuchmaster", "k")
	require.Equal(t, exitFail, code)
	require.Equal(t, 1, strings.Count(errOut, "\n"), errOut)
}

func TestUsageErrors(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no command", nil, exitUsage, "usage:"},
		{"help", []string{"help"}, exitOK, "usage:"},
		{"unknown command", []string{"delete"}, exitUsage, `idem: unknown command "delete"`},
		{"no Redis", []string{"inspect", "k"}, exitUsage, "idem inspect: no Redis: pass -redis URL or set REDIS_URL"},
		{"no key", []string{"inspect", "-redis", "redis://127.0.0.1:1"}, exitUsage, "idem inspect: missing KEY"},
		{"two keys", []string{"forget", "-redis", "redis://127.0.0.1:1", "a", "b"}, exitUsage, "one KEY expected"},
		{"flag after the key", []string{"inspect", "-redis", "redis://127.0.0.1:1", "k", "-json"}, exitUsage, "flags go before the key"},
		{"bad kind", []string{"inspect", "-redis", "redis://127.0.0.1:1", "-kind", "job", "k"}, exitUsage, `-kind "job": want do, once or http`},
		{"scope without http", []string{"inspect", "-redis", "redis://127.0.0.1:1", "-scope", "t", "k"}, exitUsage, "-scope applies to -kind http only"},
		{"bad quoted key", []string{"inspect", "-redis", "redis://127.0.0.1:1", "-kind", "http", `"k\x"`}, exitUsage, "a quoted key must be an RFC 8941 string"},
		{"bad flag", []string{"scan", "-redis", "redis://127.0.0.1:1", "-nope"}, exitUsage, "flag provided but not defined: -nope"},
		{"negative sample", []string{"scan", "-redis", "redis://127.0.0.1:1", "-sample", "-1"}, exitUsage, "-sample must be 0"},
		{"bad scheme", []string{"check", "-redis", "http://127.0.0.1:1"}, exitUsage, `unknown scheme "http"`},
		{"not a URL", []string{"check", "-redis", "127.0.0.1:6379"}, exitUsage, "is not a URL"},
		{"sentinel without master", []string{"check", "-redis", "redis+sentinel://127.0.0.1:1"}, exitUsage, "names the master after the hosts"},
		{"cluster with a db", []string{"check", "-redis", "redis+cluster://127.0.0.1:1/2"}, exitUsage, "has no databases"},
		{"unknown option", []string{"check", "-redis", "redis+cluster://127.0.0.1:1?colour=red"}, exitUsage, "colour"},
		{"unreachable", []string{"inspect", "-redis", "redis://127.0.0.1:1", "k"}, exitFail, "idem inspect: reading idem:{"},
		{"unreachable cluster", []string{"scan", "-redis", "redis+cluster://127.0.0.1:1"}, exitFail, "idem scan: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := cli(t, tt.args...)
			require.Equal(t, tt.code, code, errOut)
			require.Contains(t, errOut, tt.want)
			if tt.code == exitFail {
				require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
			}
		})
	}
}

func TestConnect(t *testing.T) {
	tests := []struct {
		url    string
		target string
		check  func(t *testing.T, c redis.UniversalClient)
	}{
		{"redis://u:p@10.0.0.1:6380/3?read_timeout=7s", "10.0.0.1:6380", func(t *testing.T, c redis.UniversalClient) {
			o := c.(*redis.Client).Options()
			require.Equal(t, []any{"u", "p", 3, 7.0, dialTimeout}, []any{o.Username, o.Password, o.DB, o.ReadTimeout.Seconds(), o.DialTimeout})
		}},
		{"redis+cluster://u:p@h1,h2:7001,[::1]:7002?dial_timeout=1s", "cluster h1:6379,h2:7001,[::1]:7002", func(t *testing.T, c redis.UniversalClient) {
			o := c.(*redis.ClusterClient).Options()
			require.Equal(t, []string{"h1:6379", "h2:7001", "[::1]:7002"}, o.Addrs)
			require.Equal(t, []any{"u", "p", 1.0}, []any{o.Username, o.Password, o.DialTimeout.Seconds()})
		}},
		{"redis+sentinel://u:p@s1,s2:26380/mymaster/2?sentinel_password=sp", `master "mymaster" via Sentinel s1:26379,s2:26380`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			c, target, err := connect(tt.url, nil)
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

// TestBinary runs the command as a separate process, as a script would: the
// test binary re-executed with asCommandEnv set runs main (see TestMain),
// with real arguments, environment, output streams and exit status, and no
// second build.
func TestBinary(t *testing.T) {
	bin, err := os.Executable()
	require.NoError(t, err)
	srv := redistest.Shared(t)
	s := seed(t, "redis://"+srv.Addr(), srv.Client(t))

	idemCmd := func(args ...string) (int, string, string) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "REDIS_URL=redis://"+srv.Addr(), asCommandEnv+"=1")
		var out, errOut strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var exit *exec.ExitError
		if err != nil {
			require.ErrorAs(t, err, &exit)
			return exit.ExitCode(), out.String(), errOut.String()
		}
		return 0, out.String(), errOut.String()
	}
	code, out, _ := idemCmd("inspect", "-json", "-prefix", s.prefix, "paid")
	require.Equal(t, 0, code)
	require.Contains(t, out, `"state":"completed"`)

	code, _, errOut := idemCmd("forget", "-prefix", s.prefix, "paid")
	require.Equal(t, 1, code)
	require.Equal(t, "idem forget: not forgotten: pass -yes to delete this record\n", errOut)

	code, _, errOut = idemCmd("inspect", "-redis", "redis://127.0.0.1:1", "paid")
	require.Equal(t, 1, code)
	require.Regexp(t, `^idem inspect: reading idem:\{[\w-]+\}: dial tcp 127\.0\.0\.1:1: connect: connection refused\n$`, errOut)

	code, _, _ = idemCmd()
	require.Equal(t, 2, code)
}
