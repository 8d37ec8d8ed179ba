package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/redistest"
)

// TestACLCommands runs inspect, scan, forget and check as the command
// line's least-privilege user of docs/operations.md, word for word but for
// the password and the test's prefix.
func TestACLCommands(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	require.NoError(t, err)
	var line string
	for _, l := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(l, "ACL SETUSER idem-ops ") {
			line = l
		}
	}
	require.NotEmpty(t, line, "docs/operations.md gives the command line's ACL line")

	ctx := context.Background()
	srv := redistest.Start(t)
	// seed's prefix is "t<n>_TestACLCommands".
	line = strings.NewReplacer(">PASSWORD", ">pw", "~idem:*", "~t*_TestACLCommands:*", "&idem:*", "&t*_TestACLCommands:*").Replace(line)
	args := []any{}
	for _, f := range strings.Fields(line) {
		args = append(args, f)
	}
	require.NoError(t, srv.Client(t).Do(ctx, args...).Err())

	url := "redis://idem-ops:pw@" + srv.Addr()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "idem-ops", Password: "pw"})
	t.Cleanup(func() { _ = c.Close() })
	s := seed(t, url, c)
	prefix := s.prefix

	require.Equal(t, "completed", inspectJSON(t, "-redis", url, "-prefix", prefix, "paid").State)

	code, out, errOut := cli(t, "scan", "-redis", url, "-prefix", prefix)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "records read     4")

	code, out, errOut = cli(t, "forget", "-redis", url, "-prefix", prefix, "-yes", "paid")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "forgot ")
	require.Equal(t, "absent", inspectJSON(t, "-redis", url, "-prefix", prefix, "paid").State)

	code, out, errOut = cli(t, "check", "-redis", url, "-prefix", prefix)
	require.Equal(t, exitOK, code, out+errOut)
	require.Contains(t, out, "ok: idem can use")
}

// TestACLVerify runs verify as the verify user of docs/operations.md, word
// for word but for the password and the test's prefix: the workload, the
// server's state before and after, and the cleanup, with nothing left.
func TestACLVerify(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	require.NoError(t, err)
	var line string
	for _, l := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(l, "ACL SETUSER idem-verify ") {
			line = l
		}
	}
	require.NotEmpty(t, line, "docs/operations.md gives the verify user's ACL line")

	ctx := context.Background()
	srv := redistest.Start(t)
	const prefix = "billing"
	line = strings.NewReplacer(">PASSWORD", ">pw", "~idem:*", "~"+prefix+":*", "&idem:*", "&"+prefix+":*").Replace(line)
	args := []any{}
	for _, f := range strings.Fields(line) {
		args = append(args, f)
	}
	admin := srv.Client(t)
	require.NoError(t, admin.Do(ctx, args...).Err())

	code, out, errOut := cli(t, "verify", "-redis", "redis://idem-verify:pw@"+srv.Addr(), "-prefix", prefix,
		"-duration", "1s", "-workers", "4", "-keys", "50")
	require.Equal(t, exitOK, code, out+errOut)
	require.Contains(t, out, "verdict: ok")
	require.Regexp(t, `cleanup: deleted [1-9]\d* keys under billing:verify-`, out)
	require.NotContains(t, out+errOut, "cleanup of", "the cleanup is complete")
	n, err := admin.DBSize(ctx).Result()
	require.NoError(t, err)
	require.Zero(t, n, "verify leaves nothing behind")
	log, err := admin.Do(ctx, "ACL", "LOG").Slice()
	require.NoError(t, err)
	require.Empty(t, log, "nothing refused")
}

// TestACLScanAsApplication: scan run as the application's user of
// docs/operations.md, which may not SCAN, fails in one line that names the
// user to run it as.
func TestACLScanAsApplication(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	require.NoError(t, err)
	var line string
	for _, l := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(l, "ACL SETUSER idem ") {
			line = l
		}
	}
	require.NotEmpty(t, line)
	srv := redistest.Start(t)
	args := []any{}
	for _, f := range strings.Fields(strings.ReplaceAll(line, ">PASSWORD", ">pw")) {
		args = append(args, f)
	}
	require.NoError(t, srv.Client(t).Do(context.Background(), args...).Err())

	code, out, errOut := cli(t, "scan", "-redis", "redis://idem:pw@"+srv.Addr())
	require.Equal(t, exitFail, code, out+errOut)
	require.Equal(t, 1, strings.Count(errOut, "\n"), errOut)
	require.Contains(t, errOut, "NOPERM")
	require.Contains(t, errOut, "idem-ops")
	require.Contains(t, errOut, "docs/operations.md")
}
