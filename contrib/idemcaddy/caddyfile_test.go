package idemcaddy_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/idemkit/idem/contrib/idemcaddy"
)

// adapt returns the JSON handlers of the first route of src's first server.
func adapt(t *testing.T, src string) []map[string]any {
	t.Helper()
	out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	for _, w := range warnings {
		t.Logf("warning: %s", w.Message)
	}
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Routes []struct {
						Handle []struct {
							Routes []struct {
								Handle []map[string]any `json:"handle"`
							} `json:"routes"`
						} `json:"handle"`
					} `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	for _, s := range cfg.Apps.HTTP.Servers {
		var handlers []map[string]any
		for _, r := range s.Routes[0].Handle[0].Routes {
			handlers = append(handlers, r.Handle...)
		}
		return handlers
	}
	t.Fatalf("no server in %s", out)
	return nil
}

// The directive is ordered before reverse_proxy by the module, wherever it
// is written, and every subdirective lands in the handler's JSON.
func TestCaddyfileAdapt(t *testing.T) {
	handlers := adapt(t, `
example.com {
	reverse_proxy 127.0.0.1:9000
	idempotency rediss+sentinel://s1,s2/mymaster {
		ca_cert /etc/idem/ca.pem
		prefix pay
		methods POST PUT
		key_header X-Request-Id
		require_key
		scope_header X-Account
		wait 5s
		lease 2s
		retention 1h
		max_body 4096
		max_response_body 8192
		store_5xx
		store_timeout 250ms
	}
}`)
	if len(handlers) != 2 {
		t.Fatalf("got %d handlers, want 2: %v", len(handlers), handlers)
	}
	if handlers[0]["handler"] != "idempotency" || handlers[1]["handler"] != "reverse_proxy" {
		t.Fatalf("order: %v then %v, want idempotency then reverse_proxy", handlers[0]["handler"], handlers[1]["handler"])
	}
	got, _ := json.Marshal(handlers[0])
	want := `{"ca_cert":"/etc/idem/ca.pem","handler":"idempotency","key_header":"X-Request-Id","lease":2000000000,"max_body":4096,"max_response_body":8192,` +
		`"methods":["POST","PUT"],"prefix":"pay","redis":"rediss+sentinel://s1,s2/mymaster","require_key":true,"retention":3600000000000,` +
		`"scope_header":"X-Account","store_5xx":true,"store_timeout":250000000,"wait":5000000000}`
	if string(got) != want {
		t.Errorf("handler JSON\n got %s\nwant %s", got, want)
	}

	handlers = adapt(t, "example.com {\n\tidempotency {\n\t\tredis redis://h:1\n\t\tkey_json /id\n\t}\n\treverse_proxy 127.0.0.1:9000\n}")
	if got, _ := json.Marshal(handlers[0]); string(got) != `{"handler":"idempotency","key_json":"/id","redis":"redis://h:1"}` {
		t.Errorf("handler JSON %s", got)
	}

	// max_response_body 0: the status and headers are stored, no body.
	handlers = adapt(t, "example.com {\n\tidempotency redis://h:1 {\n\t\tmax_response_body 0\n\t}\n\treverse_proxy 127.0.0.1:9000\n}")
	if got, _ := json.Marshal(handlers[0]); string(got) != `{"handler":"idempotency","max_response_body":0,"redis":"redis://h:1"}` {
		t.Errorf("handler JSON %s", got)
	}
}

// Bad subdirectives are refused with the line they are on.
func TestCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct{ block, want string }{
		{"bogus 1", `unknown subdirective "bogus"`},
		{"wait", "wrong argument count"},
		{"wait soon", "wait:"},
		{"lease 1s 2s", "wrong argument count"},
		{"max_body -1", "max_body: want a positive number"},
		{"max_body lots", "max_body: want a positive number"},
		{"max_response_body -1", "max_response_body: want a number of bytes, 0 or more"},
		{"store_timeout soon", "store_timeout:"},
		{"ca_cert", "wrong argument count"},
		{"require_key yes", "wrong argument count"},
		{"methods", "wrong argument count"},
	} {
		src := "idempotency redis://h:1 {\n" + tc.block + "\n}"
		var h idemcaddy.Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(src))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error with %q", tc.block, err, tc.want)
		}
	}
	var h idemcaddy.Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency a b")); err == nil {
		t.Error("two URLs: no error")
	}
}
