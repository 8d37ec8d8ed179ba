package main

import (
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
