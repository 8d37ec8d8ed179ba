package gateway_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/gateway"
)

// reported serves a keyed POST through h with a Report in its context and
// returns the Report.
func reported(h http.Handler, key string) *gateway.Report {
	r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":1}`))
	r.Header.Set("Idempotency-Key", key)
	ctx, rep := gateway.WithReport(r.Context())
	h.ServeHTTP(httptest.NewRecorder(), r.WithContext(ctx))
	return rep
}

// TestReport: a Report tells how long an answered upstream took; a failure
// is Fail's answer; a replay never reached the upstream; a body that broke
// off is told.
func TestReport(t *testing.T) {
	g, _ := newGuard(t, idem.WithLease(time.Hour))
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ int32) { io.WriteString(w, "ok") })
	h := gatewayFor(g, u.srv.URL)

	rep := reported(h, "k1")
	d, ok := rep.Upstream()
	require.True(t, ok, "the upstream answered")
	require.Positive(t, d)
	_, failed := rep.Failure()
	require.False(t, failed)
	require.False(t, rep.BodyFailed())

	rep = reported(h, "k1")
	_, ok = rep.Upstream()
	require.False(t, ok, "a replay is not sent upstream")

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "http://" + l.Addr().String()
	l.Close()
	rep = reported(gatewayFor(g, closed), "k2")
	f, failed := rep.Failure()
	require.True(t, failed)
	require.Equal(t, gateway.ProblemUnreachable, f.Type)
	require.Equal(t, gateway.Released, f.Verdict)
	_, ok = rep.Upstream()
	require.True(t, ok, "a failed call is timed to its failure")

	broken := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ int32) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "partial")
		w.(http.Flusher).Flush()
		hangUp(w)
	})
	bh := gatewayFor(g, broken.srv.URL)
	reports := make(chan *gateway.Report, 1)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, rep := gateway.WithReport(r.Context())
		defer func() { reports <- rep }() // the handler aborts the response: it panics
		bh.ServeHTTP(w, r.WithContext(ctx))
	}))
	defer front.Close()
	r, _ := http.NewRequest(http.MethodPost, front.URL+"/pay", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "k3")
	resp, err := http.DefaultClient.Do(r)
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	require.Error(t, err, "the client's response is aborted")
	require.True(t, (<-reports).BodyFailed())
}
