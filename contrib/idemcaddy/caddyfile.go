package idemcaddy

import (
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("idempotency", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("idempotency", httpcaddyfile.Before, "reverse_proxy")
}

// parseCaddyfile reads the idempotency directive.
func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile implements caddyfile.Unmarshaler:
//
//	idempotency [<redis_url>] {
//		redis              <url>
//		ca_cert            <pem_file>
//		prefix             <prefix>
//		methods            <method...>
//		key_header         <name>
//		key_json           <json_pointer>
//		require_key
//		scope_header       <name>
//		wait               <duration>
//		lease              <duration>
//		retention          <duration>
//		max_body           <bytes>
//		max_response_body  <bytes>
//		store_5xx
//		store_timeout      <duration>
//	}
//
// max_response_body 0 stores the status and headers of a response but no
// body.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	if d.NextArg() {
		h.Redis = d.Val()
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		if err := h.subdirective(d); err != nil {
			return err
		}
	}
	return nil
}

// subdirective reads one line of the block.
func (h *Handler) subdirective(d *caddyfile.Dispenser) error {
	name := d.Val()
	switch name {
	case "redis", "ca_cert", "prefix", "key_header", "key_json", "scope_header":
		var v string
		if !d.AllArgs(&v) {
			return d.ArgErr()
		}
		*map[string]*string{"redis": &h.Redis, "ca_cert": &h.CACert, "prefix": &h.Prefix, "key_header": &h.KeyHeader,
			"key_json": &h.KeyJSON, "scope_header": &h.ScopeHeader}[name] = v
	case "methods":
		h.Methods = d.RemainingArgs()
		if len(h.Methods) == 0 {
			return d.ArgErr()
		}
	case "require_key", "store_5xx":
		if d.NextArg() {
			return d.ArgErr()
		}
		*map[string]*bool{"require_key": &h.RequireKey, "store_5xx": &h.Store5xx}[name] = true
	case "wait", "lease", "retention", "store_timeout":
		var v string
		if !d.AllArgs(&v) {
			return d.ArgErr()
		}
		dur, err := caddy.ParseDuration(v)
		if err != nil {
			return d.Errf("%s: %v", name, err)
		}
		*map[string]*caddy.Duration{"wait": &h.Wait, "lease": &h.Lease, "retention": &h.Retention,
			"store_timeout": &h.StoreTimeout}[name] = caddy.Duration(dur)
	case "max_body":
		var v string
		if !d.AllArgs(&v) {
			return d.ArgErr()
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return d.Errf("%s: want a positive number of bytes, got %q", name, v)
		}
		h.MaxBody = n
	case "max_response_body":
		var v string
		if !d.AllArgs(&v) {
			return d.ArgErr()
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return d.Errf("%s: want a number of bytes, 0 or more (0: store no body), got %q", name, v)
		}
		h.MaxResponseBody = &n
	default:
		return d.Errf("unknown subdirective %q", name)
	}
	return nil
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
)
