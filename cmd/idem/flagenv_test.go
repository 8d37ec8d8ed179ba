package main

import (
	"flag"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/redistest"
)

// TestProxyFromEnvironment: the proxy starts from IDEM_* variables alone,
// and each one does what its flag does: the scope header scopes, a
// required key is required, the admin listener serves.
func TestProxyFromEnvironment(t *testing.T) {
	u := newCounting(t, nil)
	admin := closedAddr(t)
	for name, v := range map[string]string{
		"IDEM_LISTEN":       "127.0.0.1:0",
		"IDEM_UPSTREAM":     u.srv.URL,
		"IDEM_REDIS":        "redis://" + redistest.Shared(t).Addr(),
		"IDEM_PREFIX":       redistest.Prefix(t),
		"IDEM_SCOPE_HEADER": "X-Account",
		"IDEM_REQUIRE_KEY":  "true",
		"IDEM_ADMIN":        admin,
		"IDEM_WAIT":         "",  // empty: unset
		"IDEM_SCOPE_HEADRE": "x", // misspelt: warned of
		"REDIS_URL":         "redis://" + closedAddr(t),
	} {
		t.Setenv(name, v)
	}
	p := startCommand(t, "proxy")
	require.Equal(t, http.StatusBadRequest, send(t, http.MethodPost, p.url+"/charges", `{}`, "X-Account", "a").status, "IDEM_REQUIRE_KEY")
	a := send(t, http.MethodPost, p.url+"/charges", `{}`, "Idempotency-Key", "k", "X-Account", "a")
	b := send(t, http.MethodPost, p.url+"/charges", `{}`, "Idempotency-Key", "k", "X-Account", "b")
	require.Equal(t, http.StatusCreated, a.status, "IDEM_REDIS wins over REDIS_URL")
	require.Equal(t, http.StatusCreated, b.status)
	require.Empty(t, b.header.Get("Idempotent-Replayed"), "IDEM_SCOPE_HEADER: another account's key is another operation")
	require.EqualValues(t, 2, u.runs.Load())
	resp, err := http.Get("http://" + admin + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "IDEM_ADMIN")
	p.logs.await(t, map[string]any{"event": "unknown_variable", "variable": "IDEM_SCOPE_HEADRE"})
	require.Nil(t, p.logs.find(map[string]any{"event": "unscoped"}))
}

// TestProxyFlagWinsOverVariable: a flag given on the command line wins; a
// variable fills only the flags not given.
func TestProxyFlagWinsOverVariable(t *testing.T) {
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	prefix := fs.String("prefix", "idem", "")
	wait := fs.Duration("wait", 0, "")
	requireKey := fs.Bool("require-key", false, "")
	scope := fs.String("scope-header", "", "")
	require.NoError(t, fs.Parse([]string{"-prefix", "from-flag"}))
	env := map[string]string{"IDEM_PREFIX": "from-env", "IDEM_WAIT": "2s", "IDEM_REQUIRE_KEY": "true", "IDEM_SCOPE_HEADER": ""}
	require.NoError(t, setFromEnv(fs, func(name string) (string, bool) { v, ok := env[name]; return v, ok }))
	require.Equal(t, "from-flag", *prefix)
	require.Equal(t, 2*time.Second, *wait)
	require.True(t, *requireKey)
	require.Empty(t, *scope, "an empty variable counts as unset")
}

// TestProxyVariableRefused: a variable whose value does not parse stops
// the proxy at start, with a usage error that names it.
func TestProxyVariableRefused(t *testing.T) {
	for name, v := range map[string]string{"IDEM_WAIT": "soon", "IDEM_REQUIRE_KEY": "yes", "IDEM_MAX_BODY": "1MB"} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, v)
			code, _, errOut := cli(t, "proxy", "-listen", "127.0.0.1:0", "-upstream", "http://127.0.0.1:1", "-redis", "redis://"+closedAddr(t))
			require.Equal(t, exitUsage, code, errOut)
			require.True(t, strings.HasPrefix(errOut, "idem proxy: "+name+"="), errOut)
		})
	}
}

// TestProxyHelpEnvironment: -h says that every flag has a variable, names
// each one, and that a flag wins; -timeout says it bounds the check at
// start. The one-shot commands take no variable.
func TestProxyHelpEnvironment(t *testing.T) {
	code, _, errOut := cli(t, "proxy", "-h")
	require.Equal(t, exitOK, code)
	require.Contains(t, errOut, "A flag on the\ncommand line wins over its variable")
	require.Contains(t, errOut, "($IDEM_SCOPE_HEADER)")
	require.Contains(t, errOut, "($IDEM_UPSTREAM_TIMEOUT)")
	require.Regexp(t, `-timeout D\n\s+how long, D, the check of Redis at start may take`, errOut)
	code, _, errOut = cli(t, "forget", "-h")
	require.Equal(t, exitOK, code)
	require.NotContains(t, errOut, "IDEM_")
}

// TestUnknownEnv: IDEM_ variables that name no flag are reported, but for
// the ones Kubernetes sets for a Service called idem.
func TestUnknownEnv(t *testing.T) {
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	fs.String("scope-header", "", "")
	got := unknownEnv(fs, []string{"IDEM_SCOPE_HEADER=x", "IDEM_SCOPE_HEADERS=x", "IDEM_SERVICE_HOST=10.0.0.1", "IDEM_SERVICE_PORT_HTTP=80",
		"IDEM_PORT=tcp://10.0.0.1:80", "IDEM_PORT_80_TCP_ADDR=10.0.0.1", "PATH=/bin", "IDEM_UPSTRAEM=x"})
	require.Equal(t, []string{"IDEM_SCOPE_HEADERS", "IDEM_UPSTRAEM"}, got)
}
