package gateway_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/gateway"
)

// TestProblemsDocumented: docs/http.md shows Fail's problems as a keyed
// client gets them, byte for byte.
func TestProblemsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/http.md")
	require.NoError(t, err)
	for _, wrote := range []bool{false, true} {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r = r.WithContext(idem.ContextWithAttempt(r.Context(), &idem.Attempt{Fence: 1}))
		r, tr := gateway.Track(r)
		if wrote {
			httptraceWrote(t, r)
		}
		require.Equal(t, wrote, tr.Wrote())
		w := httptest.NewRecorder()
		gateway.Fail(w, r, errors.New("boom"))
		body := w.Body.String()
		// The docs break the JSON after the status, before the detail.
		head, detail, ok := strings.Cut(body, `,"detail"`)
		require.True(t, ok)
		require.Contains(t, string(doc), head+",\n "+`"detail"`+detail, "docs/http.md shows %s", body)
	}
}

// httptraceWrote makes r's trace report its headers written, as a
// transport does.
func httptraceWrote(t *testing.T, r *http.Request) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	out, err := http.NewRequestWithContext(r.Context(), http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(out)
	require.NoError(t, err)
	resp.Body.Close()
}
