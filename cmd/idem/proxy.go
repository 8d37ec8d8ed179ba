package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemprom"
)

var _ = registerServer("proxy", func(fs *flag.FlagSet) (func(context.Context, *env) error, bool) {
	p := registerProxyFlags(fs)
	return func(ctx context.Context, e *env) error { return proxyCmd(ctx, e, p) }, true
})

// proxyFlags are the options of idem proxy.
type proxyFlags struct {
	listen, upstream, admin string
	prefix                  string
	methods                 string
	keyHeader, keyJSON      string
	fingerprintJSON         string
	requireKey              bool
	scopeHeader             string
	wait, lease, retention  time.Duration
	maxBody                 int64
	maxResponse             int
	store5xx                bool
	upstreamTimeout         time.Duration
	upstreamCACert          string
	shutdownTimeout         time.Duration
	storeTimeout            time.Duration
	logRequests             bool
}

func registerProxyFlags(fs *flag.FlagSet) *proxyFlags {
	p := &proxyFlags{}
	fs.Lookup("timeout").Usage = "how long, `D`, the check of Redis at start may take (then the proxy exits 1)"
	fs.StringVar(&p.listen, "listen", "", "`ADDR` to serve on, host:port (required)")
	fs.StringVar(&p.upstream, "upstream", "", "`URL` of the upstream, http:// or https:// (required)")
	fs.StringVar(&p.admin, "admin", "", "`ADDR` of the admin listener: /healthz (alive), /readyz (Redis passes idem's check), /metrics (Prometheus); none by default")
	fs.StringVar(&p.prefix, "prefix", "idem", "key prefix `P` of the store (idem.WithPrefix)")
	fs.StringVar(&p.methods, "methods", "POST,PATCH", "comma-separated `METHODS` that need a key; the others pass through")
	fs.StringVar(&p.keyHeader, "key-header", "", "request header, `NAME`, that carries the key (default Idempotency-Key)")
	fs.StringVar(&p.keyJSON, "key-json", "", "take the key from the JSON body's member at this JSON `POINTER` (e.g. /id) instead of a header")
	fs.StringVar(&p.fingerprintJSON, "fingerprint-json", "", "compare only these comma-separated JSON `POINTERS` of the body (and the method and path) to tell a retry from another request")
	fs.BoolVar(&p.requireKey, "require-key", false, "answer 400 to a request of a configured method without a key (default: it passes through, unprotected)")
	fs.StringVar(&p.scopeHeader, "scope-header", "", "request header, `NAME`, whose value scopes the keys (the account); a keyed request without it is refused. It must be set by an authenticating layer in front that drops the client's own value")
	fs.DurationVar(&p.wait, "wait", 0, "how long, `D`, a duplicate waits for the first request's response before it gets 409 (0: at once)")
	fs.DurationVar(&p.lease, "lease", 30*time.Second, "the lease, `D`: how long a request whose outcome is unknown holds its key before a retry takes over")
	fs.DurationVar(&p.retention, "retention", 24*time.Hour, "how long, `D`, a response is stored and replayed")
	fs.Int64Var(&p.maxBody, "max-body", 1<<20, "largest request body of a keyed request, `N` bytes (larger: 413)")
	fs.IntVar(&p.maxResponse, "max-response", 1<<20, "largest response body stored, `N` bytes (a larger one is streamed and only its status and headers stored)")
	fs.BoolVar(&p.store5xx, "store-5xx", false, "store and replay the upstream's 5xx responses too (default: they release the key); the proxy's own 502/504 never are")
	fs.DurationVar(&p.upstreamTimeout, "upstream-timeout", time.Minute, "how long, `D`, to wait for the upstream's response headers (then 504, the outcome unknown)")
	fs.StringVar(&p.upstreamCACert, "upstream-cacert", "", "PEM `FILE` of the CA that signed an https upstream's certificate (default: the system's CAs)")
	fs.DurationVar(&p.shutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM or SIGINT, how long, `D`, in-flight requests may take to finish")
	fs.BoolVar(&p.logRequests, "log-requests", true, "write a log line for every request; false: only for requests that failed (the upstream unreachable or cut off, a response aborted), the metrics count the rest")
	fs.DurationVar(&p.storeTimeout, "store-timeout", time.Second, "the store budget, `D`: how long a request waits for any one Redis call (then 503, the upstream not called); while calls keep failing, keyed requests are refused at once (idem.WithStoreTimeout)")
	return p
}

// validate reports a usage error in the flags, and returns the upstream's
// URL and the methods.
func (p *proxyFlags) validate(e *env) (*url.URL, []string, error) {
	if len(e.args) > 0 {
		return nil, nil, usageError(e, fmt.Sprintf("proxy takes no arguments, got %q (flags go first)", e.args))
	}
	if p.listen == "" {
		return nil, nil, usageError(e, "-listen ADDR is required")
	}
	if _, _, err := net.SplitHostPort(p.listen); err != nil {
		return nil, nil, usageError(e, "-listen: "+err.Error())
	}
	if p.admin != "" {
		if _, _, err := net.SplitHostPort(p.admin); err != nil {
			return nil, nil, usageError(e, "-admin: "+err.Error())
		}
	}
	u, err := url.Parse(p.upstream)
	switch {
	case p.upstream == "":
		return nil, nil, usageError(e, "-upstream URL is required")
	case err != nil:
		return nil, nil, usageError(e, "-upstream: "+err.Error())
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "":
		return nil, nil, usageError(e, fmt.Sprintf("-upstream %q: want http://host[:port][/path] or https://...", p.upstream))
	case p.upstreamCACert != "" && u.Scheme != "https":
		return nil, nil, usageError(e, "-upstream-cacert applies to an https upstream only")
	}
	var methods []string
	for m := range strings.SplitSeq(p.methods, ",") {
		if m = strings.TrimSpace(m); m != "" {
			methods = append(methods, m)
		}
	}
	switch {
	case len(methods) == 0:
		return nil, nil, usageError(e, "-methods: no method")
	case p.keyJSON != "" && p.keyHeader != "":
		return nil, nil, usageError(e, "-key-json and -key-header: the key is taken from one place; give one of them")
	case p.wait < 0:
		return nil, nil, usageError(e, "-wait must not be negative")
	case p.lease <= 0, p.retention <= 0, p.upstreamTimeout <= 0, p.shutdownTimeout <= 0, p.storeTimeout <= 0:
		return nil, nil, usageError(e, "-lease, -retention, -upstream-timeout, -shutdown-timeout and -store-timeout must be positive")
	case p.maxBody <= 0:
		return nil, nil, usageError(e, "-max-body must be positive")
	case p.maxResponse < 0:
		return nil, nil, usageError(e, "-max-response must not be negative")
	case p.prefix == "":
		return nil, nil, usageError(e, "-prefix must not be empty")
	}
	return u, methods, nil
}

// proxyCmd checks Redis, then serves until ctx ends, then shuts down.
func proxyCmd(ctx context.Context, e *env, p *proxyFlags) error {
	target, methods, err := p.validate(e)
	if err != nil {
		return err
	}
	lines := newLineWriter(e.stderr, logBacklog, logGather)
	defer lines.Close()
	log := slog.New(slog.NewJSONHandler(lines, nil))
	store := idem.NewRedisStore(e.client, idem.WithPrefix(p.prefix), idem.WithStoreLogger(log))
	metrics := idemprom.New()
	cut, cutNow := context.WithCancel(context.Background())
	defer cutNow()
	h, err := newProxyHandler(p, target, methods, store, log, lines, metrics, cut)
	if err != nil {
		return usageError(e, err.Error())
	}
	cctx, cancel := ctx, context.CancelFunc(func() {})
	if e.timeout > 0 {
		cctx, cancel = context.WithTimeout(ctx, e.timeout)
	}
	err = store.Check(cctx)
	cancel()
	if err != nil {
		return fmt.Errorf("%s: %w", e.target, err)
	}
	ln, err := net.Listen("tcp", p.listen)
	if err != nil {
		return err
	}
	var adminLn net.Listener
	if p.admin != "" {
		if adminLn, err = net.Listen("tcp", p.admin); err != nil {
			ln.Close()
			return err
		}
	}
	for _, name := range e.strayEnv {
		log.Warn("idem proxy: "+name+" is set but names no flag; ignored (misspelt?)", "event", "unknown_variable", "variable", name)
	}
	if p.scopeHeader == "" {
		log.Warn("idem proxy: no -scope-header: all clients share one key space, and a client that sends another's key gets that client's stored response; set -scope-header to a header an authenticating layer in front sets", "event", "unscoped")
	}
	log.Info("idem proxy: serving", "event", "start", "listen", ln.Addr().String(), "upstream", target.Redacted(), "redis", e.target,
		"methods", strings.Join(methods, ","), "scope_header", p.scopeHeader, "lease", p.lease.String(), "wait", p.wait.String())
	running := &inflight{next: h}
	return serve(ctx, log, p.shutdownTimeout, shutdown{running: running, cut: cutNow}, []*http.Server{
		newServer(running, log),
		newAdminServer(idem.NewRedisStore(e.client, idem.WithPrefix(p.prefix), idem.WithStoreLogger(slog.New(slog.DiscardHandler))), newRegistry(metrics), log),
	}, []net.Listener{ln, adminLn})
}
