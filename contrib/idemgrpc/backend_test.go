package idemgrpc_test

// This file is the same in idemgrpc and idemconnect (only the package name
// differs): the core's redis-server harness is internal to the core module.

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// requireRedisEnv, set to 1, turns the skip for a missing redis-server into
// a test failure, as in the core module.
const requireRedisEnv = "IDEM_REQUIRE_REDIS"

// backend is the Redis a test runs on.
type backend struct {
	rdb  *redis.Client
	stop func() // makes Redis unreachable
}

// guard returns a Guard on the backend.
func (b *backend) guard(opts ...idem.Option) *idem.Guard {
	return idem.New(idem.NewRedisStore(b.rdb), opts...)
}

// forEachBackend runs f on miniredis and on a real redis-server.
func forEachBackend(t *testing.T, f func(t *testing.T, b *backend)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		f(t, newBackend(t, mr.Addr(), mr.Close))
	})
	t.Run("redis-server", func(t *testing.T) {
		addr, stop := startRedisServer(t)
		f(t, newBackend(t, addr, stop))
	})
}

func newBackend(t testing.TB, addr string, stop func()) *backend {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: 1, DialTimeout: time.Second, DialerRetryTimeout: 5 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	return &backend{rdb: rdb, stop: stop}
}

// startRedisServer starts a redis-server on a free 127.0.0.1 port, in a
// temporary directory, without persistence, and returns its address and a
// function that kills it (also run at cleanup). Without redis-server on PATH
// the test is skipped, or fails when IDEM_REQUIRE_REDIS=1.
func startRedisServer(t testing.TB) (string, func()) {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv(requireRedisEnv) == "1" {
			t.Fatalf("redis-server not on PATH (%s=1): install Debian's redis-server", requireRedisEnv)
		}
		t.Skip("redis-server not on PATH: install Debian's redis-server to run the real-server tests")
	}
	dir := t.TempDir()
	var last error
	for range 5 { // another process may take the free port in between
		addr, stop, err := launchRedis(path, dir)
		if err == nil {
			t.Cleanup(stop)
			return addr, stop
		}
		last = err
	}
	t.Fatal(last)
	return "", nil
}

func launchRedis(path, dir string) (string, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	logPath := filepath.Join(dir, "redis-"+strconv.Itoa(port)+".log")
	cmd := exec.Command(path, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", logPath)
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("start redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
	}

	addr := "127.0.0.1:" + strconv.Itoa(port)
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-exited:
			log, _ := os.ReadFile(logPath)
			return "", nil, fmt.Errorf("redis-server on %s exited during start-up:\n%s", addr, log)
		default:
		}
		if rdb.Ping(context.Background()).Err() == nil {
			return addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			log, _ := os.ReadFile(logPath)
			return "", nil, fmt.Errorf("redis-server on %s not ready after 10s:\n%s", addr, log)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
