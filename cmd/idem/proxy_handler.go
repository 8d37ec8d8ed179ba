package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/gateway"
)

// newProxyHandler returns the proxy's handler: the middleware around a
// reverse proxy to target, and the log line of each request around both.
func newProxyHandler(p *proxyFlags, target *url.URL, methods []string, store *idem.RedisStore, log *slog.Logger) (h http.Handler, err error) {
	transport, err := upstreamTransport(p)
	if err != nil {
		return nil, err
	}
	g := idem.New(store, idem.WithLease(p.lease), idem.WithRetention(p.retention), idem.WithWait(p.wait),
		idem.WithLogger(log), idem.WithObserver(decisionObserver{}))
	defer func() {
		// Middleware, KeyFromJSON and FingerprintJSON panic on options
		// they refuse: a usage error here.
		if v := recover(); v != nil {
			h, err = nil, fmt.Errorf("%v", v)
		}
	}()
	mw := g.Middleware(p.httpOptions(methods)...)
	return &logged{next: mw(upstreamHandler(target, transport, log)), log: log}, nil
}

// httpOptions are the middleware's options that the flags give.
func (p *proxyFlags) httpOptions(methods []string) []idem.HTTPOption {
	opts := []idem.HTTPOption{
		idem.WithMethods(methods...),
		idem.WithMaxRequestBody(p.maxBody),
		idem.WithMaxResponseBody(p.maxResponse),
	}
	if !p.requireKey {
		opts = append(opts, idem.WithOptionalKey())
	}
	if p.keyHeader != "" {
		opts = append(opts, idem.WithKeyHeader(p.keyHeader))
	}
	if p.keyJSON != "" {
		opts = append(opts, idem.WithKeyFunc(idem.KeyFromJSON(p.keyJSON)))
	}
	if p.fingerprintJSON != "" {
		opts = append(opts, idem.WithFingerprint(idem.FingerprintJSON(strings.Split(p.fingerprintJSON, ",")...)))
	}
	if p.scopeHeader != "" {
		name := http.CanonicalHeaderKey(p.scopeHeader)
		opts = append(opts, idem.WithScope(func(r *http.Request) string {
			// Exactly one value, or none: two values are no scope.
			if v := r.Header[name]; len(v) == 1 {
				return v[0]
			}
			return ""
		}))
	}
	if p.store5xx {
		opts = append(opts, idem.WithCacheStatus(func(code int) bool {
			switch code {
			case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
				return false
			}
			return true
		}))
	}
	return opts
}

// upstreamTransport returns the transport to the upstream: bounded dials
// and response headers, keep-alive connections.
func upstreamTransport(p *proxyFlags) (*http.Transport, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	t.ResponseHeaderTimeout = p.upstreamTimeout
	t.MaxIdleConns, t.MaxIdleConnsPerHost = 1024, 1024
	t.Proxy = nil // the upstream is reached directly, whatever HTTP_PROXY says
	if p.upstreamCACert != "" {
		roots, err := loadCACert(p.upstreamCACert)
		if err != nil {
			return nil, fmt.Errorf("-upstream-cacert: %w", err)
		}
		t.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	return t, nil
}

// upstreamHandler returns the handler inside the middleware: a reverse
// proxy to target that sends the attempt header, tells the gateway whether
// a failed request reached the upstream, and settles the key by it.
func upstreamHandler(target *url.URL, transport http.RoundTripper, log *slog.Logger) http.Handler {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.SetXForwarded()
		},
		Transport: transport,
		ModifyResponse: func(resp *http.Response) error {
			resp.Body = gateway.WatchBody(resp.Request.Context(), resp.Body)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			f := gateway.Fail(w, r, err)
			if d := decisionFrom(r.Context()); d != nil {
				d.failure, d.upstreamErr = &f, err
			}
		},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = gateway.Prepare(r)
		defer func() {
			if v := recover(); gateway.Aborted(r.Context(), v) {
				panic(v)
			}
		}()
		rp.ServeHTTP(w, r)
	})
}

// decision is what the log line of one request says; the Observer and
// the error handler fill it in.
type decision struct {
	event       *idem.Event
	failure     *gateway.Failure
	upstreamErr error
}

type decisionKey struct{}

func decisionFrom(ctx context.Context) *decision {
	d, _ := ctx.Value(decisionKey{}).(*decision)
	return d
}

// decisionObserver records each operation's event in the request's
// decision, for its log line.
type decisionObserver struct{}

func (decisionObserver) Start(ctx context.Context, _ idem.Kind) context.Context { return ctx }

func (decisionObserver) End(ctx context.Context, e idem.Event) {
	if d := decisionFrom(ctx); d != nil {
		d.event = &e
	}
}

// logged logs one line per request: what was decided and answered.
type logged struct {
	next http.Handler
	log  *slog.Logger
}

func (l *logged) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	d := &decision{}
	r = r.WithContext(context.WithValue(r.Context(), decisionKey{}, d))
	sw := &statusWriter{ResponseWriter: w}
	defer func() {
		attrs := []slog.Attr{
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Int("status", sw.status()), slog.Duration("duration", time.Since(start)),
		}
		level, outcome := slog.LevelInfo, "pass"
		if e := d.event; e != nil {
			outcome = string(e.Outcome)
			attrs = append(attrs, slog.String("id", e.ID), slog.Int64("fence", e.Fence))
			if e.Wait > 0 {
				attrs = append(attrs, slog.Duration("wait", e.Wait))
			}
		}
		if f := d.failure; f != nil {
			level = slog.LevelWarn
			attrs = append(attrs, slog.String("upstream", "failed"), slog.Bool("sent", f.Sent),
				slog.String("key", string(f.Verdict)), slog.String("err", d.upstreamErr.Error()))
		}
		attrs = append(attrs, slog.String("outcome", outcome))
		l.log.LogAttrs(r.Context(), level, "request", attrs...)
	}()
	l.next.ServeHTTP(sw, r)
}

// statusWriter notes the status sent.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 && code >= 200 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (flushes,
// upgrades of passed-through requests).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush implements http.Flusher, which the reverse proxy asks for.
func (w *statusWriter) Flush() {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *statusWriter) status() int {
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}
