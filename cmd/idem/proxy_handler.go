package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemprom"
	"github.com/idemkit/idem/internal/gateway"
	"github.com/idemkit/idem/internal/redisurl"
)

// newProxyHandler returns the proxy's handler: the middleware around a
// reverse proxy to target, counted by metrics (whose store gauge watches
// the proxy's Guard), and the log line of each request, written to lines,
// around all. When cut ends, the calls to the upstream still running are
// cut off.
func newProxyHandler(p *proxyFlags, target *url.URL, methods []string, store *idem.RedisStore, log *slog.Logger, lines io.Writer, metrics *idemprom.Metrics, cut context.Context) (h http.Handler, err error) {
	transport, err := upstreamTransport(p)
	if err != nil {
		return nil, err
	}
	g := idem.New(store, idem.WithLease(p.lease), idem.WithRetention(p.retention), idem.WithWait(p.wait),
		idem.WithStoreTimeout(p.storeTimeout), idem.WithLogger(log), idem.WithObserver(observers{decisionObserver{}, metrics}))
	metrics.Watch(g) // for the life of the process
	defer func() {
		// Middleware, KeyFromJSON and FingerprintJSON panic on options
		// they refuse: a usage error here.
		if v := recover(); v != nil {
			h, err = nil, fmt.Errorf("%v", v)
		}
	}()
	mw := g.Middleware(p.httpOptions(methods)...)
	return &logged{next: metrics.Middleware(mw(upstreamHandler(target, transport, log, cut))), lines: lines, all: p.logRequests}, nil
}

// observers tells each of its Observers of every operation, in order.
type observers []idem.Observer

// Start implements idem.Observer.
func (os observers) Start(ctx context.Context, kind idem.Kind) context.Context {
	for _, o := range os {
		ctx = o.Start(ctx, kind)
	}
	return ctx
}

// End implements idem.Observer.
func (os observers) End(ctx context.Context, e idem.Event) {
	for _, o := range os {
		o.End(ctx, e)
	}
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
		roots, err := redisurl.LoadCACert(p.upstreamCACert)
		if err != nil {
			return nil, fmt.Errorf("-upstream-cacert: %w", err)
		}
		t.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	return t, nil
}

// errCut is the cause of an upstream call cut off at shutdown.
var errCut = errors.New("idem proxy: cut off at the end of the shutdown grace period")

// upstreamHandler returns the handler inside the middleware: a reverse
// proxy to target that sends the attempt header, tells the gateway whether
// a failed request reached the upstream, and settles the key by it. The
// middleware runs it detached from the client's connection (a client that
// goes away does not stop it); its call to the upstream is cut off when cut
// ends, at shutdown, and then fails as any upstream failure does: a
// request not yet sent releases its key, one sent keeps it until its lease
// runs out.
func upstreamHandler(target *url.URL, transport http.RoundTripper, log *slog.Logger, cut context.Context) http.Handler {
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
		ctx, cancel := context.WithCancelCause(r.Context())
		defer cancel(nil)
		defer context.AfterFunc(cut, func() { cancel(errCut) })()
		r = gateway.Prepare(r.WithContext(ctx))
		defer func() {
			if v := recover(); gateway.Aborted(r.Context(), v) {
				panic(v)
			}
		}()
		rp.ServeHTTP(w, r)
	})
}
