package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// What the freeze scenario (scen_freeze.go) runs on: a redis-server of its
// own and the three entry points, each logging when its function ran.

// freezeGuard returns a Guard on c with idem's defaults, whose store and
// engine log nothing: the scenario counts what they would say.
func freezeGuard(c *redis.Client) *idem.Guard {
	quiet := slog.New(slog.DiscardHandler)
	return idem.New(idem.NewRedisStore(c, idem.WithPrefix("fz"), idem.WithStoreLogger(quiet)),
		idem.WithRetention(retention), idem.WithLogger(quiet))
}

// answerKind is what a request got, whatever the entry point.
type answerKind int

const (
	answered    answerKind = iota // the result, run now or replayed
	notRecorded                   // Do: fn's value with ErrNotRecorded
	refused                       // ErrStoreUnavailable, 503
	busy                          // ErrInProgress, 409
	failed                        // anything else
)

// freezeCall is one request and its answer.
type freezeCall struct {
	key        string
	start, end time.Time
	kind       answerKind
}

// runLog records when each key's function (handler, upstream) ran.
type runLog struct {
	mu    sync.Mutex
	first map[string]time.Time
	runs  map[string]int
	upAtt map[string]int // proxy: the highest Idempotency-Attempt the upstream saw per key
}

func newRunLog() *runLog {
	return &runLog{first: map[string]time.Time{}, runs: map[string]int{}, upAtt: map[string]int{}}
}

func (l *runLog) ran(key string, attempt int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.runs[key] == 0 {
		l.first[key] = time.Now()
	}
	l.runs[key]++
	l.upAtt[key] = max(l.upAtt[key], attempt)
}

// freezeServer is a redis-server of the scenario's own, which it freezes,
// kills and restarts on the same port.
type freezeServer struct {
	bin, dir string
	port     int
	cmd      *exec.Cmd
}

func startFreezeServer(ctx context.Context, e *env) (*freezeServer, error) {
	port, err := freePort(false)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "idem-bench-freeze-")
	if err != nil {
		return nil, err
	}
	s := &freezeServer{bin: e.cfg.redisServer, dir: dir, port: port}
	e.onClose(func() { s.stop(); os.RemoveAll(dir) })
	return s, s.launch(ctx)
}

func (s *freezeServer) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

func (s *freezeServer) launch(ctx context.Context) error {
	s.cmd = exec.Command(s.bin, "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--daemonize", "no", "--logfile", filepath.Join(s.dir, "redis.log"))
	if err := s.cmd.Start(); err != nil {
		return err
	}
	return waitRedis(ctx, s.addr())
}

func (s *freezeServer) signal(sig syscall.Signal) error { return s.cmd.Process.Signal(sig) }

// stop kills the server (SIGKILL ends a frozen one too) and reaps it.
func (s *freezeServer) stop() {
	if s.cmd != nil && s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}

// answering polls the server with PING until it answers, and returns when.
func (s *freezeServer) answering(ctx context.Context) (time.Time, error) {
	c := redis.NewClient(&redis.Options{Addr: s.addr(), ContextTimeoutEnabled: true, MaxRetries: -1,
		DialTimeout: 50 * time.Millisecond, ReadTimeout: 50 * time.Millisecond})
	defer c.Close()
	for {
		pctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		err := c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return time.Now(), nil
		}
		if ctx.Err() != nil {
			return time.Time{}, ctx.Err()
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// freezePath is an entry point under test: send sends one request with key.
type freezePath struct {
	name string
	send func(ctx context.Context, key string) answerKind
	log  *runLog
}

// doPath: idem.Do on a client configured as the README recommends.
func doPath(e *env, addr string) *freezePath {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 64})
	e.onClose(func() { c.Close() })
	g := freezeGuard(c)
	p := &freezePath{name: "`idem.Do`", log: newRunLog()}
	p.send = func(ctx context.Context, key string) answerKind {
		_, err := idem.Do(ctx, g, key, theReq, func(context.Context, *idem.Attempt) (payment, error) {
			p.log.ran(key, 0)
			return thePayment, nil
		})
		switch {
		case err == nil:
			return answered
		case errors.Is(err, idem.ErrNotRecorded):
			return notRecorded
		case errors.Is(err, idem.ErrStoreUnavailable):
			return refused
		case errors.Is(err, idem.ErrInProgress):
			return busy
		}
		return failed
	}
	return p
}

// httpPath posts to url with a keep-alive client and maps the status.
func httpPath(e *env, name, url string, log *runLog) *freezePath {
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 512}, Timeout: time.Minute}
	e.onClose(client.CloseIdleConnections)
	return &freezePath{name: name, log: log, send: func(ctx context.Context, key string) answerKind {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/payments", strings.NewReader(string(httpReqBody)))
		if err != nil {
			return failed
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			return failed
		}
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusCreated:
			return answered
		case http.StatusServiceUnavailable:
			return refused
		case http.StatusConflict:
			return busy
		}
		return failed
	}}
}

// upstream is the handler behind the middleware and the proxy: it logs its
// run per key and answers 201.
func upstream(log *runLog) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		att, _ := strconv.Atoi(r.Header.Get("Idempotency-Attempt"))
		log.ran(r.Header.Get("Idempotency-Key"), att)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(httpRespBody)
	})
}

func middlewarePath(e *env, addr string) *freezePath {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 64})
	e.onClose(func() { c.Close() })
	log := newRunLog()
	srv := httptest.NewServer(freezeGuard(c).Middleware()(upstream(log)))
	e.onClose(srv.Close)
	return httpPath(e, "`g.Middleware`", srv.URL, log)
}

func proxyPath(e *env, bin, addr string) (*freezePath, error) {
	log := newRunLog()
	up := httptest.NewServer(upstream(log))
	e.onClose(up.Close)
	p, err := startProxyProcess(e, exec.Command(bin, "proxy", "-listen", "127.0.0.1:0", "-upstream", up.URL,
		"-redis", "redis://"+addr, "-prefix", "fz", "-retention", "10m"), true)
	if err != nil {
		return nil, fmt.Errorf("idem proxy: %w", err)
	}
	return httpPath(e, "`idem proxy`", p.url, log), nil
}
