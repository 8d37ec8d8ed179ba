package idemprom_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemprom"
	"github.com/idemkit/idem/internal/gateway"
)

// served is a Guard on miniredis whose middleware, around handler, is
// counted by a Metrics registered with reg.
type served struct {
	mr  *miniredis.Miniredis
	reg *prometheus.Registry
	h   http.Handler
}

func serve(t *testing.T, handler http.Handler, opts ...idem.HTTPOption) *served {
	t.Helper()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	m := idemprom.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	g := idem.New(idem.NewRedisStore(c), idem.WithObserver(m), idem.WithLease(time.Hour))
	t.Cleanup(m.Watch(g))
	return &served{mr: mr, reg: reg, h: m.Middleware(g.Middleware(opts...)(handler))}
}

// do sends a request; header is name, value pairs.
func (s *served) do(method, body string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, "/pay", strings.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	s.h.ServeHTTP(w, r)
	return w
}

// families gathers reg's metrics by name.
func families(t *testing.T, reg prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// byOutcome returns idem_requests_total and the count of
// idem_request_duration_seconds by outcome.
func byOutcome(t *testing.T, reg prometheus.Gatherer) (total, timed map[string]float64) {
	t.Helper()
	fams := families(t, reg)
	total, timed = map[string]float64{}, map[string]float64{}
	for _, m := range fams[idemprom.RequestsTotal].GetMetric() {
		total[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
	}
	for _, m := range fams[idemprom.RequestDuration].GetMetric() {
		timed[m.GetLabel()[0].GetValue()] = float64(m.GetHistogram().GetSampleCount())
	}
	return total, timed
}

// TestOutcomes: every outcome a service's middleware can give is counted
// once per request, and timed; every outcome's series exists from the
// start.
func TestOutcomes(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	s := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "slow" {
			close(entered)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	}), idem.WithMaxRequestBody(16), idem.WithScope(func(r *http.Request) string { return r.Header.Get("X-Account") }))

	total, _ := byOutcome(t, s.reg)
	require.Len(t, total, len(idemprom.Outcomes()), "every outcome's series exists from the start")
	for _, o := range idemprom.Outcomes() {
		require.Zero(t, total[string(o)], o)
	}

	acct := []string{"X-Account", "a"}
	key := func(k string) []string { return append([]string{"Idempotency-Key", k}, acct...) }
	require.Equal(t, http.StatusCreated, s.do(http.MethodPost, `{}`, key("k1")...).Code)
	require.Equal(t, "true", s.do(http.MethodPost, `{}`, key("k1")...).Header().Get(idem.ReplayedHeader))
	require.Equal(t, http.StatusUnprocessableEntity, s.do(http.MethodPost, `{"a":1}`, key("k1")...).Code)
	require.Equal(t, http.StatusBadRequest, s.do(http.MethodPost, `{}`, acct...).Code)
	require.Equal(t, http.StatusInternalServerError, s.do(http.MethodPost, `{}`, "Idempotency-Key", "k2").Code)
	require.Equal(t, http.StatusRequestEntityTooLarge, s.do(http.MethodPost, `{"much":"more than sixteen bytes"}`, key("k3")...).Code)
	require.Equal(t, http.StatusCreated, s.do(http.MethodGet, ``).Code)

	done := make(chan int)
	go func() { done <- s.do(http.MethodPost, `{}`, key("slow")...).Code }()
	<-entered
	require.Equal(t, http.StatusConflict, s.do(http.MethodPost, `{}`, key("slow")...).Code)
	close(release)
	require.Equal(t, http.StatusCreated, <-done)

	s.mr.Close()
	require.Equal(t, http.StatusServiceUnavailable, s.do(http.MethodPost, `{}`, key("k4")...).Code)

	total, timed := byOutcome(t, s.reg)
	want := map[string]float64{"executed": 2, "replayed": 1, "mismatch": 1, "key_missing": 1, "scope_missing": 1,
		"too_large": 1, "passed_through": 1, "store_unavailable": 1, "in_progress": 1}
	for o, n := range want {
		require.Equal(t, n, total[o], o)
		require.Equal(t, n, timed[o], o)
	}
	fams := families(t, s.reg)
	require.Zero(t, fams[idemprom.InFlight].GetMetric()[0].GetGauge().GetValue(), "nothing in flight at the end")
	require.Zero(t, fams[idemprom.StoreFailing].GetMetric()[0].GetGauge().GetValue())
	require.Positive(t, fams[idemprom.StoreDuration].GetMetric()[0].GetHistogram().GetSampleCount())
	require.Zero(t, fams[idemprom.UpstreamDuration].GetMetric()[0].GetHistogram().GetSampleCount(), "no gateway: no upstream")
}

// TestInFlight: a keyed request is in flight from its claim until its end.
func TestInFlight(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	s := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
	}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.do(http.MethodPost, `{}`, "Idempotency-Key", "k")
	}()
	<-entered
	require.Equal(t, 1.0, families(t, s.reg)[idemprom.InFlight].GetMetric()[0].GetGauge().GetValue())
	close(release)
	<-done
	require.Zero(t, families(t, s.reg)[idemprom.InFlight].GetMetric()[0].GetGauge().GetValue())
}

// proxyTo returns a reverse proxy to target that uses internal/gateway, as
// idem proxy does.
func proxyTo(target string) http.Handler {
	u, _ := url.Parse(target)
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) },
		ModifyResponse: func(resp *http.Response) error {
			resp.Body = gateway.WatchBody(resp.Request.Context(), resp.Body)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) { gateway.Fail(w, r, err) },
		Transport:    &http.Transport{ResponseHeaderTimeout: time.Second},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = gateway.Prepare(r)
		defer func() {
			if p := recover(); gateway.Aborted(r.Context(), p) {
				panic(p)
			}
		}()
		rp.ServeHTTP(w, r)
	})
}

// TestUpstreamOutcomes: behind a gateway, the upstream is timed, and its
// failures are told apart: not sent, sent and dropped, timed out.
func TestUpstreamOutcomes(t *testing.T) {
	hang := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch r.URL.Query().Get("do") {
		case "drop":
			c, _, _ := http.NewResponseController(w).Hijack()
			c.Close()
		case "hang":
			<-hang
		default:
			w.WriteHeader(http.StatusCreated)
		}
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() { close(hang) }) // first: up.Close waits for the hanging request
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "http://" + l.Addr().String()
	l.Close()

	mux := http.NewServeMux()
	mux.Handle("/up/", proxyTo(up.URL))
	mux.Handle("/down/", proxyTo(closed))
	s := serve(t, mux, idem.WithOptionalKey())
	send := func(path, key string) int {
		r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{}`))
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		s.h.ServeHTTP(w, r)
		return w.Code
	}
	require.Equal(t, http.StatusCreated, send("/up/", "k1"))
	require.Equal(t, http.StatusBadGateway, send("/down/", "k2"))
	require.Equal(t, http.StatusBadGateway, send("/up/?do=drop", "k3"))
	require.Equal(t, http.StatusGatewayTimeout, send("/up/?do=hang", "k4"))
	require.Equal(t, http.StatusCreated, send("/up/", ""))

	total, _ := byOutcome(t, s.reg)
	for o, n := range map[string]float64{"executed": 1, "upstream_unreachable": 1, "upstream_failed": 1, "upstream_timeout": 1, "passed_through": 1} {
		require.Equal(t, n, total[o], o)
	}
	require.EqualValues(t, 5, families(t, s.reg)[idemprom.UpstreamDuration].GetMetric()[0].GetHistogram().GetSampleCount(),
		"every call upstream is timed, passed through or not")
}

// TestRegisteredTwice: one Metrics serves several registries, as Caddy
// makes one per configuration; a second registration with the same
// registry is refused as already registered.
func TestRegisteredTwice(t *testing.T) {
	m := idemprom.New()
	a, b := prometheus.NewPedanticRegistry(), prometheus.NewPedanticRegistry()
	require.NoError(t, a.Register(m))
	require.NoError(t, b.Register(m))
	var are prometheus.AlreadyRegisteredError
	require.ErrorAs(t, a.Register(m), &are)
	require.Len(t, families(t, b), 6)
}
