package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redistest"
)

// TestInspectHint: a key found absent under the given -kind is looked up
// under the other kinds, and the hint names where it was found, or that a
// -scope may be missing. The state stays absent and the exit status 0.
func TestInspectHint(t *testing.T) {
	srv := redistest.Shared(t)
	url := "redis://" + srv.Addr()
	s := seed(t, url, srv.Client(t))
	// A middleware without WithScope.
	h := idem.New(s.store).Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "k-noscope")
	h.ServeHTTP(httptest.NewRecorder(), r)
	flags := []string{"inspect", "-redis", url, "-prefix", s.prefix}

	tests := []struct {
		name  string
		args  []string
		found []string
		hint  string
	}{
		{"http key under the default kind", []string{"k-noscope"}, []string{"-kind http"},
			`hint         no do record for this key; found one with -kind http: idem inspect -kind http KEY`},
		{"quoted http key", []string{`"k-noscope"`}, []string{"-kind http"}, `found one with -kind http`},
		{"do key as once", []string{"-kind", "once", "paid"}, []string{"-kind do"},
			`hint         no once record for this key; found one with -kind do: idem inspect -kind do KEY`},
		{"scoped http key", []string{"k-http"}, nil,
			`hint         no record for this key under -kind do, once or http (without -scope); ` +
				`if the middleware uses WithScope, pass -kind http -scope SCOPE (what WithScope returns for the request)`},
		{"wrong scope", []string{"-kind", "http", "-scope", "tenant-2", "k-http"}, nil,
			`hint         no record for this key under -kind do, once or http without -scope; check -scope: it must be what WithScope returns for the request`},
		{"scope given, record without", []string{"-kind", "http", "-scope", "tenant-2", "k-noscope"}, []string{"-kind http"},
			`found one with -kind http: idem inspect -kind http KEY`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := cli(t, append(flags, tt.args...)...)
			require.Equal(t, exitOK, code, errOut)
			require.Contains(t, out, "state        absent")
			require.Contains(t, out, tt.hint)
			require.Equal(t, 1, strings.Count(out, "hint "), out)

			in := inspectJSON(t, append(flags[1:], tt.args...)...)
			require.Equal(t, "absent", in.State)
			require.Equal(t, tt.found, in.FoundWith)
			require.NotEmpty(t, in.Hint)
		})
	}

	// A record found under the given kind gets no hint.
	code, out, _ := cli(t, append(flags, "paid")...)
	require.Equal(t, exitOK, code)
	require.NotContains(t, out, "hint")
	require.Empty(t, inspectJSON(t, append(flags[1:], "paid")...).Hint)
}

// TestUsageSummary: every command's line in the usage summary shows its
// flags, -timeout included.
func TestUsageSummary(t *testing.T) {
	code, _, errOut := cli(t, "help")
	require.Equal(t, exitOK, code)
	for _, name := range []string{"inspect", "forget", "scan", "check"} {
		var line string
		for l := range strings.SplitSeq(errOut, "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "idem "+name+" ") {
				line = l
			}
		}
		require.NotEmpty(t, line, name)
		require.Contains(t, line, "[-timeout D]", name)
	}
}

// TestInspectOnce: a Once record holds no value, only that its id was
// processed (or a Permanent error); inspect says so instead of "json, 0 B".
func TestInspectOnce(t *testing.T) {
	srv := redistest.Shared(t)
	url := "redis://" + srv.Addr()
	s := seed(t, url, srv.Client(t))
	g := idem.New(s.store)
	ctx := context.Background()
	_, err := g.Once(ctx, "msg-1", func(context.Context) error { return nil })
	require.NoError(t, err)
	_, err = g.Once(ctx, "msg-2", func(context.Context) error { return idem.Permanent(errors.New("poison")) })
	require.Error(t, err)
	flags := []string{"inspect", "-redis", url, "-prefix", s.prefix, "-kind", "once"}

	code, out, errOut := cli(t, append(flags, "msg-1")...)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "result       processed: the id is marked done; redeliveries get ran=false and do not run\n")
	require.NotContains(t, out, "json")
	require.Equal(t, &storedResult{Type: "processed"}, inspectJSON(t, append(flags[1:], "msg-1")...).Result)

	code, out, errOut = cli(t, append(flags, "msg-2")...)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, `result       error (idem.Permanent): "poison"`)

	// A Do result of any size is still a value.
	code, out, _ = cli(t, "inspect", "-redis", url, "-prefix", s.prefix, "paid")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "result       string, 9 B")
}
