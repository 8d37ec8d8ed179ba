package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/redistest"
)

// lastJSON decodes the last line of out as the verdict of -json.
func lastJSON(t *testing.T, out string) verdict {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var v verdict
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &v), out)
	return v
}

// TestVerifySoundServer: on a server that keeps what it acknowledged, the
// workload violates nothing, and verify leaves no key behind.
func TestVerifySoundServer(t *testing.T) {
	srv := redistest.Shared(t)
	code, out, errOut := cli(t, "verify", "-redis", "redis://"+srv.Addr(),
		"-duration", "1s", "-workers", "8", "-keys", "200", "-json")
	require.Equal(t, exitOK, code, errOut)
	v := lastJSON(t, out)
	require.Zero(t, v.Violations, errOut)
	require.Zero(t, v.Duplicates)
	require.Zero(t, v.Lost)
	require.Greater(t, v.Operations, v.Probes, "the workload ran")
	require.Positive(t, v.Effects)
	require.Contains(t, errOut, "verdict: ok, no invariant violated")
	require.Contains(t, errOut, "latency      p50 ")
	require.True(t, strings.HasPrefix(v.Prefix, "idem:verify-"), "under the default store prefix's pattern idem:*: %s", v.Prefix)

	keys, err := srv.Client(t).Keys(context.Background(), v.Prefix+"*").Result()
	require.NoError(t, err)
	require.Empty(t, keys, "verify deletes what it wrote")
}

// TestVerifyEvictingServer: a server that evicts idem's records under
// memory pressure lets keys run again; verify counts the duplicate effects,
// names eviction as their cause and exits 1.
func TestVerifyEvictingServer(t *testing.T) {
	// 3 s: enough operations to fill 2 MB and have records evicted, even
	// on a loaded machine.
	srv := redistest.Start(t, redistest.WithArgs("--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"))
	code, out, errOut := cli(t, "verify", "-redis", "redis://"+srv.Addr(),
		"-duration", "3s", "-keys", "2000", "-payload", "8192")
	require.Equal(t, exitFail, code, out)
	require.Regexp(t, `duplicates   [1-9]`, out)
	require.Contains(t, out, "fault: eviction: the server evicted")
	require.Contains(t, out, "from a documented limit of idem: eviction")
	require.Contains(t, out, "verdict: FAILED")
	require.Contains(t, errOut, "invariant violation(s) on "+srv.Addr())
}

func TestVerifyUsage(t *testing.T) {
	srv := redistest.Shared(t)
	url := "redis://" + srv.Addr()
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{name: "negative duration", args: []string{"-duration", "-1s"}, code: exitUsage, want: "-duration must be positive"},
		{name: "no workers", args: []string{"-workers", "0"}, code: exitUsage, want: "-workers must be between"},
		{name: "no keys", args: []string{"-keys", "0"}, code: exitUsage, want: "-keys must be between"},
		{name: "huge payload", args: []string{"-payload", "2000000"}, code: exitUsage, want: "-payload must be between"},
		{name: "argument", args: []string{"extra"}, code: exitUsage, want: "verify takes no arguments"},
		{name: "unknown flag", args: []string{"-nope"}, code: exitUsage, want: "flag provided but not defined"},
		{name: "empty prefix", args: []string{"-prefix", ""}, code: exitUsage, want: "-prefix must not be empty"},
		{name: "prefix with a brace", args: []string{"-prefix", "a{b}"}, code: exitUsage, want: "-prefix must not contain { or }"},
		{name: "no rate", args: []string{"-rate", "0"}, code: exitUsage, want: "-rate must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := cli(t, append([]string{"verify", "-redis", url}, tt.args...)...)
			require.Equal(t, tt.code, code)
			require.Contains(t, errOut, tt.want)
		})
	}
}

// TestVerifyUnreachable: a server that cannot be used is one line and
// exit 1, before any workload.
func TestVerifyUnreachable(t *testing.T) {
	srv := redistest.Start(t)
	addr := srv.Addr()
	srv.Kill(t)
	code, out, errOut := cli(t, "verify", "-redis", "redis://"+addr+"?dial_timeout=200ms", "-timeout", "1s", "-duration", "1s")
	require.Equal(t, exitFail, code)
	require.Empty(t, out)
	require.Equal(t, 1, strings.Count(errOut, "\n"), errOut)
	require.Contains(t, errOut, "idem verify: "+addr+" cannot be used")
}

// TestVerifyPrefix: with -prefix P, verify writes under P:verify-RANDOM,
// which an ACL pattern ~P:* covers and the application's records (P:{…})
// never meet, and deletes only that.
func TestVerifyPrefix(t *testing.T) {
	srv := redistest.Shared(t)
	prefix := redistest.Prefix(t)
	ctx := context.Background()
	c := srv.Client(t)
	require.NoError(t, c.Set(ctx, prefix+":{app-record}", "kept", 0).Err())
	t.Cleanup(func() { c.Del(context.Background(), prefix+":{app-record}") })
	code, out, errOut := cli(t, "verify", "-redis", "redis://"+srv.Addr(), "-prefix", prefix,
		"-duration", "1s", "-workers", "4", "-keys", "50", "-json")
	require.Equal(t, exitOK, code, errOut)
	v := lastJSON(t, out)
	require.True(t, strings.HasPrefix(v.Prefix, prefix+":verify-"), v.Prefix)
	require.Contains(t, errOut, "cleanup: deleted ")
	keys, err := c.Keys(ctx, prefix+"*").Result()
	require.NoError(t, err)
	require.Equal(t, []string{prefix + ":{app-record}"}, keys, "verify deletes its own keys only")
}

// TestVerifyErrorsExplained: the report says what each kind of error in
// its errors line means; none of them is a violation.
func TestVerifyErrorsExplained(t *testing.T) {
	var b strings.Builder
	printErrors(&b, map[string]int{"canceled": 3, "failed": 13, "mismatch": 81, "permanent": 176, "odd_kind": 1})
	out := b.String()
	require.Contains(t, out, "errors       canceled 3, failed 13, mismatch 81, odd_kind 1, permanent 176\n")
	for _, want := range []string{
		"canceled: calls cut short when -duration ran out",
		"failed: ", "mismatch: ", "permanent: ",
		"not violations in themselves",
	} {
		require.Contains(t, out, want)
	}
	b.Reset()
	printErrors(&b, map[string]int{})
	require.Equal(t, "errors       none\n", b.String())
}
