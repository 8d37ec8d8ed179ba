package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// plainProxyEnv, set to "LISTEN UPSTREAM", makes this binary a plain
// httputil.ReverseProxy: the baseline of scenario 14, run as a process of
// its own as idem proxy is.
const plainProxyEnv = "IDEM_BENCH_PLAIN_PROXY"

// init serves a proxy of scenario 14 instead of running the benchmark when
// this binary is re-executed as one.
func init() {
	if v := os.Getenv(plainProxyEnv); v != "" {
		os.Exit(servePlainProxy(v))
	}
	if v := os.Getenv(floorProxyEnv); v != "" {
		os.Exit(serveFloorProxy(v))
	}
}

// servePlainProxy serves a plain reverse proxy with the transport settings
// of idem proxy, until killed.
func servePlainProxy(spec string) int {
	listen, upstream, _ := strings.Cut(spec, " ")
	rp, err := reverseProxy(upstream)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return serveUntilKilled(listen, rp)
}

// reverseProxy returns an httputil.ReverseProxy to upstream with the
// transport settings of idem proxy.
func reverseProxy(upstream string) (*httputil.ReverseProxy, error) {
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, err
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost, t.Proxy = 1024, 1024, nil
	return &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(u)
		pr.SetXForwarded()
	}, Transport: t}, nil
}

// serveUntilKilled serves h on listen, printing the address it listens
// on, and returns an exit status only if it cannot serve.
func serveUntilKilled(listen string, h http.Handler) int {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("listening " + ln.Addr().String())
	_ = http.Serve(ln, h)
	return 1
}

// proxyProcess is a proxy running as a child process.
type proxyProcess struct {
	url string
	cmd *exec.Cmd
}

// startProxyProcess starts cmd, which prints a line naming its address
// (the plain proxy) or logs it in JSON on standard error (idem proxy), and
// waits for it.
func startProxyProcess(e *env, cmd *exec.Cmd, fromStderr bool) (*proxyProcess, error) {
	var out io.ReadCloser
	var err error
	if fromStderr {
		out, err = cmd.StderrPipe()
	} else {
		out, err = cmd.StdoutPipe()
	}
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	e.onClose(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			if a, ok := strings.CutPrefix(line, "listening "); ok {
				addr <- a
				// The log lines of idem proxy, read as a log collector
				// would: in large reads, not line by line.
				_, _ = io.Copy(io.Discard, out)
				return
			} else if i := strings.Index(line, `"listen":"`); i >= 0 && strings.Contains(line, `"event":"start"`) {
				a := line[i+len(`"listen":"`):]
				addr <- a[:strings.IndexByte(a, '"')]
				_, _ = io.Copy(io.Discard, out)
				return
			}
		}
		close(addr)
	}()
	select {
	case a, ok := <-addr:
		if !ok {
			return nil, errors.New("the proxy exited before it served")
		}
		return &proxyProcess{url: "http://" + a, cmd: cmd}, nil
	case <-time.After(30 * time.Second):
		return nil, errors.New("the proxy did not start within 30s")
	}
}

// buildIdem builds the idem command into dir and returns its path. Under
// -race (the bench's tests) the command is built with -race too, from the
// packages the core's tests compiled, instead of compiling them again; its
// figures then mean nothing, and the tests check only that it runs.
func buildIdem(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "idem")
	args := []string{"build", "-o", bin}
	if raceBuild {
		args = append(args, "-race")
	}
	// cmd/idem is a module of its own; its go.work names the repository's
	// folders.
	work, err := filepath.Abs("../cmd/idem/go.work")
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "go", append(args, ".")...)
	cmd.Dir = "../cmd/idem"
	cmd.Env = append(os.Environ(), "GOWORK="+work)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build cmd/idem: %w: %s", err, out)
	}
	return bin, nil
}

// runProxy is scenario 14: idem proxy vs a plain httputil.ReverseProxy
// and vs the floor proxy (floor_proxy.go), each a process of its own in
// front of an upstream of its own.
func runProxy(ctx context.Context, e *env) error {
	clients := e.cfg.clients
	dir, err := os.MkdirTemp("", "idem-bench-proxy-")
	if err != nil {
		return err
	}
	e.onClose(func() { os.RemoveAll(dir) })
	progress("scenario 14: building cmd/idem")
	bin, err := buildIdem(ctx, dir)
	if err != nil {
		return err
	}
	// Each proxy has an upstream of its own, the bare handler, so that
	// idem's upstream counts idem's executions only.
	up, upFloor := newHTTPTarget(e, nil, httpRespBody), newHTTPTarget(e, nil, httpRespBody)
	upIdem, upQuiet := newHTTPTarget(e, nil, httpRespBody), newHTTPTarget(e, nil, httpRespBody)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	plainCmd := exec.Command(self)
	plainCmd.Env = append(os.Environ(), plainProxyEnv+"=127.0.0.1:0 "+up.srv.URL)
	plain, err := startProxyProcess(e, plainCmd, false)
	if err != nil {
		return fmt.Errorf("plain proxy: %w", err)
	}
	floorCmd := exec.Command(self)
	floorCmd.Env = append(os.Environ(), floorProxyEnv+"=127.0.0.1:0 "+upFloor.srv.URL+" "+e.redisAddr+" f-"+e.nonce)
	floor, err := startProxyProcess(e, floorCmd, false)
	if err != nil {
		return fmt.Errorf("floor proxy: %w", err)
	}
	idemCmd := exec.Command(bin, "proxy", "-listen", "127.0.0.1:0", "-upstream", upIdem.srv.URL,
		"-redis", "redis://"+e.redisAddr, "-prefix", "p-"+e.nonce, "-retention", "10m", "-scope-header", "X-Account")
	withIdem, err := startProxyProcess(e, idemCmd, true)
	if err != nil {
		return fmt.Errorf("idem proxy: %w", err)
	}
	quietCmd := exec.Command(bin, "proxy", "-listen", "127.0.0.1:0", "-upstream", upQuiet.srv.URL,
		"-redis", "redis://"+e.redisAddr, "-prefix", "q-"+e.nonce, "-retention", "10m", "-scope-header", "X-Account", "-log-requests=false")
	quiet, err := startProxyProcess(e, quietCmd, true)
	if err != nil {
		return fmt.Errorf("idem proxy -log-requests=false: %w", err)
	}
	client := &http.Client{
		Transport: &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 512, IdleConnTimeout: time.Minute},
		Timeout:   30 * time.Second,
	}
	e.onClose(client.CloseIdleConnections)
	post := func(ctx context.Context, base, key string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/payments", strings.NewReader(string(httpReqBody)))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-Account", "acct_42")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}

	progress("scenario 14: idem proxy vs httputil.ReverseProxy, %d clients", clients)
	fresh := keyer("pf-" + e.nonce)
	var sent atomic.Int64 // fresh requests answered through idem proxy
	plainFresh := &variant{name: "httputil.ReverseProxy", clients: clients, srv: e.serverUsec,
		op: func(ctx context.Context, w int, seq uint64) error { return post(ctx, plain.url, fresh.key(w, seq)) }}
	floorFresh := &variant{name: "floor proxy (SET NX PX, then SET PX)", clients: clients, srv: e.serverUsec,
		op: func(ctx context.Context, w int, seq uint64) error { return post(ctx, floor.url, fresh.key(w, seq)) }}
	// counted returns the variant that sends fresh keys through the idem
	// proxy at base and counts the requests answered in sent.
	counted := func(name, base string, sent *atomic.Int64) *variant {
		return &variant{name: name, clients: clients, srv: e.serverUsec,
			op: func(ctx context.Context, w int, seq uint64) error {
				err := post(ctx, base, fresh.key(w, seq))
				if err == nil {
					sent.Add(1)
				}
				return err
			}}
	}
	var sentQuiet atomic.Int64
	idemFresh := counted("idem proxy, fresh keys", withIdem.url, &sent)
	quietFresh := counted("idem proxy -log-requests=false, fresh keys", quiet.url, &sentQuiet)
	if err := compare(ctx, e.cfg, "proxy fresh keys", plainFresh, floorFresh, idemFresh, quietFresh); err != nil {
		return err
	}
	freshRuns, quietRuns := upIdem.effects.Load(), upQuiet.effects.Load()

	n := e.cfg.replayKeys
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "pr-" + e.nonce + "-" + strconv.Itoa(i)
	}
	pick := func(w int, seq uint64) string { return keys[(uint64(w)*7919+seq)%uint64(n)] }
	plainReplay := &variant{name: "httputil.ReverseProxy", clients: clients, srv: e.serverUsec,
		op: func(ctx context.Context, w int, seq uint64) error { return post(ctx, plain.url, pick(w, seq)) }}
	// replays returns the variant that replays the keys through the idem
	// proxy at base, whose upstream is up, and the count of the upstream's
	// runs since the keys were stored.
	replays := func(name, base string, up *httpTarget) (*variant, func() int64) {
		var populated int64
		return &variant{name: name, clients: clients, srv: e.serverUsec,
			setup: func(ctx context.Context) error {
				err := populate(ctx, n, func(ctx context.Context, i int) error { return post(ctx, base, keys[i]) })
				populated = up.effects.Load()
				return err
			},
			op: func(ctx context.Context, w int, seq uint64) error {
				err := post(ctx, base, pick(w, seq))
				if err == nil && up.effects.Load() != populated {
					err = errors.New("a replay ran the upstream")
				}
				return err
			}}, func() int64 { return up.effects.Load() - populated }
	}
	idemReplay, idemRan := replays("idem proxy, replays", withIdem.url, upIdem)
	quietReplay, quietRan := replays("idem proxy -log-requests=false, replays", quiet.url, upQuiet)
	if err := compare(ctx, e.cfg, "proxy replays", plainReplay, idemReplay, quietReplay); err != nil {
		return err
	}
	replayRan := idemRan() + quietRan()
	sec := e.rep.section("14. idem proxy vs httputil.ReverseProxy",
		fmt.Sprintf("%d clients (keep-alive `http.Client`) → a proxy process → the bare handler of section 2 (reads a 60 B JSON "+
			"body, answers 201 with 200 B) on an `httptest.Server`, all on loopback. The proxies run as processes of their own "+
			"with the same transport settings: the baseline is a plain `httputil.ReverseProxy` (this binary re-executed), the floor "+
			"the same proxy claiming each keyed request with `SET NX PX` before sending it and storing status and body with `SET PX` "+
			"after (go-redis defaults; no fingerprint, owner, fence, renewal or log: the least a proxy that runs each key once does), "+
			"`idem proxy` is the built command with `-scope-header X-Account` and its JSON log line per request (to a pipe that a "+
			"goroutine reads in large reads, as a log collector would), and again with `-log-requests=false` (a line for failed requests only). cli µs/op is the benchmark process's CPU only (clients and upstream), not the proxies'. Fresh keys: "+
			"idem's upstream ran %d times for %d answered requests. Replays: %d pre-completed keys in each idem proxy; their upstreams ran %d times "+
			"during the replay rounds (the baseline's runs its upstream every time).",
			clients, freshRuns, sent.Load(), n, replayRan))
	sec.pair(plainFresh, idemFresh)
	sec.pair(floorFresh, idemFresh)
	sec.pair(floorFresh, quietFresh)
	sec.pair(plainReplay, idemReplay)
	sec.pair(plainReplay, quietReplay)
	e.rep.ratioTarget("idem proxy fresh / the floor proxy (§14)", "proxy fresh", idemFresh, floorFresh, 0.9)
	e.rep.ratioTarget("idem proxy -log-requests=false fresh / the floor proxy (§14)", "proxy quiet fresh", quietFresh, floorFresh, 0.9)
	e.rep.ratioTarget("idem proxy replays / httputil.ReverseProxy running the upstream (§14)", "proxy replay", idemReplay, plainReplay, 1.5)
	e.rep.ratioTarget("idem proxy -log-requests=false replays / httputil.ReverseProxy running the upstream (§14)", "proxy quiet replay", quietReplay, plainReplay, 1.5)
	e.rep.exactTarget("idem proxy: upstream runs per fresh request", float64(freshRuns)/float64(max(sent.Load(), 1)), 1)
	e.rep.exactTarget("idem proxy -log-requests=false: upstream runs per fresh request", float64(quietRuns)/float64(max(sentQuiet.Load(), 1)), 1)
	e.rep.exactTarget("idem proxy: upstream runs during replays", float64(replayRan), 0)
	return nil
}
