package idemcaddy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/idemkit/idem"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// checkTimeout bounds the Redis check made at provision.
const checkTimeout = 10 * time.Second

// Handler is the http.handlers.idempotency module: idem's HTTP middleware
// in front of the rest of the route (see the package documentation). The
// JSON field names are those of the Caddyfile's subdirectives.
type Handler struct {
	// Redis is the Redis URL: redis://[user:password@]host:port[/db][?options],
	// rediss:// (TLS), unix:///path, a master through its Sentinels as
	// redis+sentinel://host:port,host:port/master[/db], or a Redis Cluster
	// as redis+cluster://host:port,host:port (rediss+… for TLS), as the idem
	// command takes them. Required. Global placeholders are replaced at
	// provision: with {env.REDIS_URL}, the password stays out of the
	// configuration.
	Redis string `json:"redis,omitempty"`
	// CACert is the PEM file of the CA that signed the Redis servers'
	// certificates, for a TLS URL; by default the system's CAs are
	// trusted. Global placeholders are replaced at provision.
	CACert string `json:"ca_cert,omitempty"`
	// Prefix is the key prefix of the records (idem.WithPrefix); default "idem".
	Prefix string `json:"prefix,omitempty"`
	// Methods are the methods that need a key; default POST and PATCH.
	Methods []string `json:"methods,omitempty"`
	// KeyHeader is the request header carrying the key; default
	// Idempotency-Key.
	KeyHeader string `json:"key_header,omitempty"`
	// KeyJSON takes the key from the member of a JSON request body that
	// this JSON Pointer names (idem.KeyFromJSON), instead of a header.
	KeyJSON string `json:"key_json,omitempty"`
	// RequireKey answers a request of a configured method without a key
	// with 400; by default it passes through unprotected.
	RequireKey bool `json:"require_key,omitempty"`
	// ScopeHeader names the request header whose value scopes the keys (the
	// account or tenant, set by an authenticating layer in front). A keyed
	// request without exactly one value of it is refused. Without ScopeHeader all clients share
	// one key space.
	ScopeHeader string `json:"scope_header,omitempty"`
	// Wait is how long a duplicate waits for the first request's response
	// before it gets 409; default 0, answer at once.
	Wait caddy.Duration `json:"wait,omitempty"`
	// Lease is how long a claim stays exclusive without a heartbeat, and so
	// how long a key whose upstream call ended in an unknown outcome stays
	// taken; default 30s.
	Lease caddy.Duration `json:"lease,omitempty"`
	// Retention is how long a stored response is kept; default 24h.
	Retention caddy.Duration `json:"retention,omitempty"`
	// MaxBody is the largest request body read to fingerprint it, in bytes;
	// a larger one gets 413. Default 1 MiB.
	MaxBody int64 `json:"max_body,omitempty"`
	// MaxResponseBody is the largest response body stored, in bytes; a
	// larger one is sent as it comes and only its status and headers are
	// stored. 0 stores no body at all, only the status and headers (the
	// smallest records, for clients that need only the status and Location
	// on a retry). Unset (nil): 1 MiB.
	MaxResponseBody *int `json:"max_response_body,omitempty"`
	// Store5xx stores the upstream's 5xx answers too, instead of releasing
	// the key so that a retry reaches the upstream again. The module's own
	// 502 and 504 for an upstream that failed are never stored.
	Store5xx bool `json:"store_5xx,omitempty"`
	// StoreTimeout is the store budget (idem.WithStoreTimeout): how long a
	// request waits for any one Redis call, whatever the URL's timeouts;
	// then 503, the upstream not called. While calls keep failing, keyed
	// requests are refused at once until a probe succeeds. Default 1s.
	StoreTimeout caddy.Duration `json:"store_timeout,omitempty"`

	mw      func(http.Handler) http.Handler
	url     string // Redis with its placeholders replaced
	caCert  string // CACert with its placeholders replaced
	pooled  bool   // this handler uses the client of url and caCert in clients
	unwatch func() // stops idem_store_failing watching this handler's Guard
}

// CaddyModule implements caddy.Module.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.idempotency",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision implements caddy.Provisioner: it takes the shared Redis client,
// checks that Redis can be used (as idem check does) and builds the
// middleware. It fails on a configuration idem refuses.
func (h *Handler) Provision(ctx caddy.Context) error {
	if err := h.validate(); err != nil {
		return err
	}
	repl := caddy.NewReplacer()
	h.url = repl.ReplaceAll(h.Redis, "") // {env.REDIS_URL}
	h.caCert = repl.ReplaceAll(h.CACert, "")
	rdb, err := loadClient(h.url, h.caCert)
	if err != nil {
		return fmt.Errorf("idempotency: %w", err)
	}
	h.pooled = true
	fail := func(err error) error {
		h.pooled = false
		_ = releaseClient(h.url, h.caCert)
		return err
	}
	if err := registerMetrics(ctx); err != nil {
		return fail(err)
	}
	slog := ctx.Slogger()
	store := idem.NewRedisStore(rdb, idem.WithPrefix(h.prefix()), idem.WithStoreLogger(slog))
	cctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	if err := store.Check(cctx); err != nil {
		return fail(fmt.Errorf("idempotency: redis check: %w", err))
	}
	g := idem.New(store,
		idem.WithLease(time.Duration(h.Lease)),
		idem.WithRetention(time.Duration(h.Retention)),
		idem.WithWait(time.Duration(h.Wait)),
		idem.WithStoreTimeout(time.Duration(h.StoreTimeout)),
		idem.WithLogger(slog),
		idem.WithObserver(metrics))
	mw, err := middleware(g, h.options())
	if err != nil {
		return fail(err)
	}
	h.mw = mw
	h.unwatch = metrics.Watch(g)
	if h.ScopeHeader == "" {
		ctx.Logger().Warn("idempotency without scope_header: all clients share one key space, so a client sending another client's key gets that client's stored response; set scope_header to a header an authenticating layer sets",
			zap.String("redis_prefix", h.prefix()))
	}
	return nil
}

// validate refuses the field combinations idem cannot take.
func (h *Handler) validate() error {
	switch {
	case h.Redis == "":
		return errors.New("idempotency: redis URL required")
	case h.KeyJSON != "" && h.KeyHeader != "":
		return errors.New("idempotency: key_header and key_json: the key is taken from one place; give one of them")
	case h.Wait < 0, h.Lease < 0, h.Retention < 0, h.StoreTimeout < 0:
		return errors.New("idempotency: wait, lease, retention and store_timeout must not be negative")
	case h.MaxBody < 0, h.MaxResponseBody != nil && *h.MaxResponseBody < 0:
		return errors.New("idempotency: max_body and max_response_body must not be negative")
	}
	if h.KeyJSON != "" {
		if _, err := keyFromJSON(h.KeyJSON); err != nil {
			return err
		}
	}
	return nil
}

func (h *Handler) prefix() string {
	if h.Prefix == "" {
		return "idem"
	}
	return h.Prefix
}

// middleware returns g.Middleware(opts...), or the error its panic gives
// for an option idem refuses.
func middleware(g *idem.Guard, opts []idem.HTTPOption) (mw func(http.Handler) http.Handler, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("idempotency: %v", p)
		}
	}()
	return g.Middleware(opts...), nil
}

// options returns the middleware's options for h's fields.
func (h *Handler) options() []idem.HTTPOption {
	var opts []idem.HTTPOption
	if len(h.Methods) > 0 {
		opts = append(opts, idem.WithMethods(h.Methods...))
	}
	if h.KeyHeader != "" {
		opts = append(opts, idem.WithKeyHeader(h.KeyHeader))
	}
	if h.KeyJSON != "" {
		f, _ := keyFromJSON(h.KeyJSON) // validate checked it
		opts = append(opts, idem.WithKeyFunc(f))
	}
	if !h.RequireKey {
		opts = append(opts, idem.WithOptionalKey())
	}
	if h.ScopeHeader != "" {
		name := http.CanonicalHeaderKey(h.ScopeHeader)
		opts = append(opts, idem.WithScope(func(r *http.Request) string {
			if v := r.Header[name]; len(v) == 1 { // two values are no scope
				return v[0]
			}
			return ""
		}))
	}
	if h.MaxBody > 0 {
		opts = append(opts, idem.WithMaxRequestBody(h.MaxBody))
	}
	if h.MaxResponseBody != nil {
		opts = append(opts, idem.WithMaxResponseBody(*h.MaxResponseBody))
	}
	if h.Store5xx {
		opts = append(opts, idem.WithCacheStatus(store5xx))
	}
	return opts
}

// keyFromJSON returns idem.KeyFromJSON(pointer), or an error where it would
// panic: pointer is not a JSON Pointer.
func keyFromJSON(pointer string) (f func(*http.Request, []byte) (string, error), err error) {
	defer func() {
		if p := recover(); p != nil {
			f, err = nil, fmt.Errorf("idempotency: key_json: %v", p)
		}
	}()
	return idem.KeyFromJSON(pointer), nil
}

// store5xx is the storage rule of store_5xx: every status but 408, 409,
// 425 and 429, which say "try again". The module's own 502 and 504 for an
// upstream that failed are never stored (internal/gateway).
func store5xx(code int) bool {
	switch code {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return true
}

// Cleanup implements caddy.CleanerUpper: it gives up this handler's use of
// the shared Redis client, which closes with its last user, and stops
// idem_store_failing watching its Guard.
func (h *Handler) Cleanup() error {
	if h.unwatch != nil {
		h.unwatch()
		h.unwatch = nil
	}
	if !h.pooled {
		return nil
	}
	h.pooled = false
	return releaseClient(h.url, h.caCert)
}
