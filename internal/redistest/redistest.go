// Package redistest runs real Redis servers for tests.
//
// Start launches a private redis-server on a free 127.0.0.1 port for one
// test, which may stop, kill, pause and restart it on the same port to take
// Redis down mid-way. Shared returns one server started lazily for the whole
// test binary, which tests must not take down and in which they keep apart by
// key (Prefix gives each test its own key prefix). StartCluster and
// SharedCluster do the same for a three-master Redis Cluster. StartTLS
// starts a private server that speaks TLS only, with a certificate signed by
// a CA the test makes (NewCA); WithoutCommands starts one without commands
// such as CONFIG, as managed services run Redis.
//
// ReplyDropper is a go-redis Dialer that lets chosen commands run on the
// server and then loses their replies by closing the connection, so that
// go-redis re-sends them: the duplicate-execution hazard of retried commands.
//
// Servers never persist anything unless stopped with Server.Stop, listen
// only on 127.0.0.1, and are killed by the test's cleanup (shared ones by
// StopShared, or on Linux by the kernel when the test binary exits).
//
// When redis-server is not on PATH, the tests that need it are skipped, or
// fail when IDEM_REQUIRE_REDIS=1 is set, so a CI job cannot silently lose
// them. Clusters are formed with CLUSTER commands; redis-cli is not needed.
package redistest

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	skipServer = "redis-server not on PATH: install Debian's redis-server to run the real-server tests"

	// RequireEnv names the environment variable that, set to 1, turns the
	// skip for a missing redis-server into a test failure.
	RequireEnv = "IDEM_REQUIRE_REDIS"

	startTimeout = 10 * time.Second
	probeTimeout = 500 * time.Millisecond
)

// An Option configures a server started by Start or a cluster started by
// StartCluster.
type Option func(*config)

type config struct {
	args []string
}

// WithArgs passes extra command-line configuration to redis-server, for
// example WithArgs("--maxmemory", "10mb"). By default a server runs with
// --save "" --appendonly no and binds 127.0.0.1 only.
func WithArgs(args ...string) Option {
	return func(c *config) { c.args = append(c.args, args...) }
}

// WithoutCommands disables commands as managed Redis services do, with
// rename-command NAME "": WithoutCommands("CONFIG") starts a server that
// answers CONFIG with "unknown command".
func WithoutCommands(names ...string) Option {
	return func(c *config) {
		for _, n := range names {
			c.args = append(c.args, "--rename-command", n, "")
		}
	}
}

// A Server is a redis-server process listening on 127.0.0.1. Its methods
// may be called from any goroutine.
type Server struct {
	path    string // redis-server binary
	dir     string
	port    int
	busPort int // cluster bus port of a cluster node
	args    []string
	shared  bool
	tls     *tls.Config // a client's, trusting the server's CA; nil: plain TCP

	mu   sync.Mutex
	proc *process
}

// Start starts a redis-server on a free 127.0.0.1 port, waits until it
// answers PING and registers its termination with tb.Cleanup. It skips the
// test when redis-server is not on PATH (see RequireEnv).
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	path := lookPath(tb, "redis-server", skipServer)
	var c config
	for _, o := range opts {
		o(&c)
	}
	s, err := startServer(path, tb.TempDir(), c.args)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.stopNow)
	return s
}

// lookPath finds a binary or skips (fails, with RequireEnv) the test.
func lookPath(tb testing.TB, name, why string) string {
	tb.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv(RequireEnv) == "1" {
			tb.Fatalf("%s (%s=1)", why, RequireEnv)
		}
		tb.Skip(why)
	}
	return path
}

// startServer starts a server in dir, retrying on a fresh port when another
// process grabbed the chosen one in between.
func startServer(path, dir string, args []string) (*Server, error) {
	return start(&Server{path: path, dir: dir, args: args})
}

// start launches s on a free port, retrying on a fresh one when another
// process grabbed the chosen one in between.
func start(s *Server) (*Server, error) {
	var err error
	for range 5 {
		var ports []int
		ports, err = freePorts(1)
		if err != nil {
			return nil, err
		}
		s.port = ports[0]
		if err = s.launch(); err == nil {
			return s, nil
		}
		if !errors.Is(err, errAddrInUse) {
			return nil, err
		}
	}
	return nil, err
}

var errAddrInUse = errors.New("redistest: address already in use")

// freePorts returns n distinct free TCP ports on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close() // held until all are chosen, so they are distinct
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func (s *Server) logPath() string { return filepath.Join(s.dir, "redis.log") }

// launch starts the process and waits until it answers PING.
func (s *Server) launch() error {
	args := []string{"--port", strconv.Itoa(s.port)}
	if s.tls != nil { // TLS only: no plain port
		args = []string{"--port", "0", "--tls-port", strconv.Itoa(s.port)}
	}
	args = append(args,
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--daemonize", "no",
		"--logfile", "",
	)
	args = append(args, s.args...)
	proc, err := spawn(s.path, args, s.dir, s.logPath())
	if err != nil {
		return fmt.Errorf("redistest: start redis-server: %w", err)
	}
	if err := waitReady(proc, s.Addr(), s.tls, s.logPath()); err != nil {
		proc.kill()
		return err
	}
	s.mu.Lock()
	s.proc = proc
	s.mu.Unlock()
	return nil
}

// waitReady polls addr with PING (over TLS when tc is not nil) until it
// answers PONG, then checks that the process answering is proc.
func waitReady(proc *process, addr string, tc *tls.Config, logPath string) error {
	deadline := time.Now().Add(startTimeout)
	for {
		if proc.reap(false) {
			log := readLog(logPath)
			if strings.Contains(log, "Address already in use") {
				return errAddrInUse
			}
			return fmt.Errorf("redistest: redis-server on %s exited during startup:\n%s", addr, log)
		}
		reply, err := send(addr, tc, probeTimeout, "PING")
		if err == nil && reply == "PONG" {
			return checkOwner(proc, addr, tc)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: redis-server on %s not ready after %v (last: %v):\n%s",
				addr, startTimeout, err, readLog(logPath))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkOwner asks the server on addr for its process id: when another
// process took the port between freePorts and the bind, that process
// answered PING, and proc is about to exit.
func checkOwner(proc *process, addr string, tc *tls.Config) error {
	// A loaded machine may take longer than a probe to answer (a TLS
	// handshake under the race detector): a few tries, as waitReady's.
	var info string
	var err error
	for try := 0; try < 10; try++ {
		if info, err = send(addr, tc, probeTimeout, "INFO", "server"); err == nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("redistest: INFO on %s: %w", addr, err)
	}
	if pid, ok := infoField(info, "process_id"); !ok || !proc.is(pid) {
		proc.kill()
		return errAddrInUse
	}
	return nil
}

// infoField returns an integer field of an INFO reply.
func infoField(info, name string) (int, bool) {
	for line := range strings.Lines(info) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == name {
			n, err := strconv.Atoi(v)
			return n, err == nil
		}
	}
	return 0, false
}

// readLog returns the tail of a server log, for error messages.
func readLog(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Addr returns the server's address, "127.0.0.1:port". It stays the same
// across Stop and Restart.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port returns the server's TCP port.
func (s *Server) Port() int { return s.port }

// Options returns fresh go-redis options for the server, for tests that set
// a Dialer, timeouts or retries before calling redis.NewClient. For a server
// started by StartTLS, TLSConfig trusts its CA.
func (s *Server) Options() *redis.Options {
	o := &redis.Options{Addr: s.Addr()}
	if s.tls != nil {
		o.TLSConfig = s.tls.Clone()
	}
	return o
}

// Client returns a go-redis client for the server, closed by tb.Cleanup.
func (s *Server) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewClient(s.Options())
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// FlushAll removes every key on the server.
func (s *Server) FlushAll(tb testing.TB) {
	tb.Helper()
	if _, err := send(s.Addr(), s.tls, probeTimeout, "FLUSHALL"); err != nil {
		tb.Fatalf("redistest: FLUSHALL on %s: %v", s.Addr(), err)
	}
}

// Running reports whether the server process is up (it may be paused).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil && !s.proc.reap(false)
}

func (s *Server) notShared(tb testing.TB, method string) {
	tb.Helper()
	if s.shared {
		tb.Fatalf("redistest: %s on a shared server; use Start for a server a test takes down", method)
	}
}

// Stop shuts the server down gracefully, saving its data (SHUTDOWN SAVE),
// so that Restart brings back the same keys, TTLs included, as a restarted
// Redis with persistence would. Clients see connection errors until then.
func (s *Server) Stop(tb testing.TB) {
	tb.Helper()
	s.notShared(tb, "Stop")
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		tb.Fatalf("redistest: Stop: server %s is not running", s.Addr())
	}
	_ = s.proc.resume() // a paused server could not answer
	_, _ = send(s.Addr(), s.tls, probeTimeout, "SHUTDOWN", "SAVE")
	if !s.proc.waitExit(startTimeout) {
		s.proc.kill()
		tb.Fatalf("redistest: Stop: server %s did not shut down:\n%s", s.Addr(), readLog(s.logPath()))
	}
	s.proc = nil
}

// Kill ends the server with SIGKILL, like a crash without persistence: a
// later Restart starts with no keys.
func (s *Server) Kill(tb testing.TB) {
	tb.Helper()
	s.notShared(tb, "Kill")
	s.stopNow()
	_ = os.Remove(filepath.Join(s.dir, "dump.rdb"))
}

// stopNow kills the process if it runs.
func (s *Server) stopNow() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.kill()
		s.proc = nil
	}
}

// Restart starts a stopped or killed server again on the same port and waits
// until it answers PING (and has loaded the data saved by Stop).
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.notShared(tb, "Restart")
	if s.Running() {
		tb.Fatalf("redistest: Restart: server %s is running", s.Addr())
	}
	if err := s.launch(); err != nil {
		tb.Fatalf("redistest: Restart %s: %v", s.Addr(), err)
	}
}

// Pause freezes the server process (SIGSTOP): connections stay open but no
// command is answered, so clients run into their timeouts.
func (s *Server) Pause(tb testing.TB) {
	tb.Helper()
	s.control(tb, "Pause", (*process).pause)
}

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume(tb testing.TB) {
	tb.Helper()
	s.control(tb, "Resume", (*process).resume)
}

func (s *Server) control(tb testing.TB, method string, f func(*process) error) {
	tb.Helper()
	s.notShared(tb, method)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		tb.Fatalf("redistest: %s: server %s is not running", method, s.Addr())
	}
	if err := f(s.proc); err != nil {
		tb.Fatalf("redistest: %s %s: %v", method, s.Addr(), err)
	}
}

// Prefix returns a key prefix unique to tb within the test binary, derived
// from the test's name, for tests that share a server. It contains no '{',
// '}' or ':' so it cannot disturb Redis Cluster hash tags.
func Prefix(tb testing.TB) string {
	name := unsafeChars.ReplaceAllString(tb.Name(), "_")
	if len(name) > 60 {
		name = name[len(name)-60:]
	}
	return fmt.Sprintf("t%d_%s", prefixSeq.Add(1), name)
}
