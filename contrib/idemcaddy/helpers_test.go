package idemcaddy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	_ "github.com/idemkit/idem/contrib/idemcaddy"
	"github.com/idemkit/idem/internal/redistest"
)

// The tests share one Caddy, run in this process by caddytest and
// configured through its admin endpoint on a loopback port of this test
// binary's own; they load their configurations one after another, so none
// of them runs in parallel.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idemcaddy")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Caddy's own files (autosaved configuration, storage) go there.
	os.Setenv("XDG_CONFIG_HOME", dir)
	os.Setenv("XDG_DATA_HOME", dir)
	os.Setenv("HOME", dir)
	ports := freePorts(3)
	caddytest.Default.AdminPort = ports[0]
	caddytest.Default.LoadRequestTimeout = 15 * time.Second
	caddytest.Default.TestRequestTimeout = 30 * time.Second
	httpPort, httpsPort = ports[1], ports[2]
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var httpPort, httpsPort int

// freePorts returns n distinct free ports of 127.0.0.1.
func freePorts(n int) []int {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			panic(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// siteConfig returns a Caddyfile whose one site, on 127.0.0.1, runs the
// idempotency directive with the given block in front of site.
func siteConfig(block, site string) string {
	return rawSite("idempotency {\n\t\t" + strings.ReplaceAll(block, "\n", "\n\t\t") + "\n\t}\n\t" + site)
}

// rawSite returns a Caddyfile whose one site, on 127.0.0.1, is body.
func rawSite(body string) string {
	return fmt.Sprintf(`{
	admin localhost:%d
	http_port %s
	https_port %d
	default_bind 127.0.0.1
	auto_https off
	skip_install_trust
	persist_config off
	grace_period 1ns
}

http://127.0.0.1:%s {
	%s
}
`, caddytest.Default.AdminPort, sitePort, httpsPort, sitePort, body)
}

// sitePort stands for the site's port in a configuration until load gives
// it one.
const sitePort = "{IDEMCADDY_SITE_PORT}"

// withPort returns cfg on the site's current port.
func withPort(cfg string) string { return strings.ReplaceAll(cfg, sitePort, strconv.Itoa(httpPort)) }

// load makes cfg Caddy's configuration, its site on a port of its own:
// the server of the configuration before may still accept a connection on
// its port as it stops (Caddy's App.Stop says so), and close it then.
func load(t *testing.T, cfg string) {
	t.Helper()
	httpPort = freePorts(1)[0]
	tc := caddytest.NewTester(t)
	tc.InitServer(withPort(cfg), "caddyfile")
	if t.Failed() {
		t.FailNow()
	}
	// Connections kept alive to the configuration before lead nowhere now.
	client.CloseIdleConnections()
}

// caddyURL is the URL of path on the Caddy site.
func caddyURL(path string) string { return fmt.Sprintf("http://127.0.0.1:%d%s", httpPort, path) }

// redisServer starts a redis-server of the test's own.
func redisServer(t *testing.T) *redistest.Server { return redistest.Start(t) }

// redisURL is the URL of s, with short timeouts so that a frozen server
// is noticed quickly.
func redisURL(s *redistest.Server) string {
	return "redis://" + s.Addr() + "?dial_timeout=1s&read_timeout=500ms&write_timeout=500ms"
}

// upstream is an HTTP server that counts the executions of each key: it
// answers 201 with {"key", "n", "attempt"}, n being the executions of that
// key so far. Under /drop/ it drops the connection without answering on
// a key's first attempt, after counting it, and under /partial/ it drops
// it in the middle of the answer; under /status/N it answers N.
type upstream struct {
	*httptest.Server
	mu       sync.Mutex
	runs     map[string]int      // executions per key
	attempts map[string][]string // Idempotency-Attempt per execution
	scopes   map[string]string   // X-Account of a key's last execution
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{runs: map[string]int{}, attempts: map[string][]string{}, scopes: map[string]string{}}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	attempt := r.Header.Get("Idempotency-Attempt")
	u.mu.Lock()
	id := r.Header.Get("X-Account") + "/" + key
	u.runs[id]++
	n := u.runs[id]
	u.attempts[id] = append(u.attempts[id], attempt)
	u.mu.Unlock()
	switch {
	case strings.HasPrefix(r.URL.Path, "/drop/") && attempt == "1":
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		return
	case strings.HasPrefix(r.URL.Path, "/partial/") && attempt == "1":
		// Half an answer, then the connection drops.
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"half":`))
		_ = http.NewResponseController(w).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		return
	case strings.HasPrefix(r.URL.Path, "/status/"):
		var code int
		fmt.Sscan(strings.TrimPrefix(r.URL.Path, "/status/"), &code)
		w.WriteHeader(code)
		fmt.Fprintf(w, "status %d run %d", code, n)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/things/"+key)
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]any{"key": key, "n": n, "attempt": attempt, "path": r.URL.Path})
}

// count returns the executions of key (under scope, "" without one) and
// the Idempotency-Attempt header of each.
func (u *upstream) count(scope, key string) (int, []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	id := scope + "/" + key
	return u.runs[id], append([]string(nil), u.attempts[id]...)
}

// reply is a response read whole.
type reply struct {
	status int
	header http.Header
	body   string
}

var client = &http.Client{Timeout: 30 * time.Second}

// post sends a POST with body and the given headers (name, value pairs)
// to the Caddy site.
func post(t *testing.T, path, body string, headers ...string) reply {
	t.Helper()
	return send(t, http.MethodPost, path, body, headers...)
}

func send(t *testing.T, method, path, body string, headers ...string) reply {
	t.Helper()
	r, err := try(method, path, body, headers...)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

// try sends a request and returns the response, or the error of a
// response that broke off.
func try(method, path, body string, headers ...string) (reply, error) {
	req, err := http.NewRequest(method, caddyURL(path), bytes.NewBufferString(body))
	if err != nil {
		return reply{}, err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return reply{res.StatusCode, res.Header, string(b)}, err
}
