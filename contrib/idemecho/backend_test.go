package idemecho_test

// This file is the same in every contrib module (only the package name
// differs): the core's redis-server harness is internal to the core module.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// requireRedisEnv, set to 1, turns the skip for a missing redis-server into
// a test failure, as in the core module.
const requireRedisEnv = "IDEM_REQUIRE_REDIS"

// backend is the Redis a test runs on, behind a store that can be taken down.
type backend struct {
	store *faultStore
}

// guard returns a Guard on the backend's store.
func (b *backend) guard(opts ...idem.Option) *idem.Guard { return idem.New(b.store, opts...) }

// forEachBackend runs f on miniredis and on a real redis-server.
func forEachBackend(t *testing.T, f func(t *testing.T, b *backend)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		f(t, newBackend(t, miniredis.RunT(t).Addr()))
	})
	t.Run("redis-server", func(t *testing.T) {
		f(t, newBackend(t, startRedisServer(t)))
	})
}

func newBackend(t *testing.T, addr string) *backend {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	return &backend{store: &faultStore{Store: idem.NewRedisStore(rdb)}}
}

// faultStore fails every claim while down is set, as an unreachable Redis
// does.
type faultStore struct {
	idem.Store
	down atomic.Bool
}

func (s *faultStore) Claim(ctx context.Context, id string, c idem.ClaimRequest) (idem.ClaimResult, error) {
	if s.down.Load() {
		return idem.ClaimResult{}, errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	}
	return s.Store.Claim(ctx, id, c)
}

// startRedisServer starts a redis-server on a free 127.0.0.1 port, in a
// temporary directory, without persistence, and returns its address; the
// test's cleanup kills it. Without redis-server on PATH the test is skipped,
// or fails when IDEM_REQUIRE_REDIS=1.
func startRedisServer(t *testing.T) string {
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
		addr, err := launchRedis(t, path, dir)
		if err == nil {
			return addr
		}
		last = err
	}
	t.Fatal(last)
	return ""
}

func launchRedis(t *testing.T, path, dir string) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	logPath := filepath.Join(dir, "redis-"+strconv.Itoa(port)+".log")
	cmd := exec.Command(path, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", logPath)
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() { _ = cmd.Process.Kill(); <-exited }

	addr := "127.0.0.1:" + strconv.Itoa(port)
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-exited:
			log, _ := os.ReadFile(logPath)
			return "", fmt.Errorf("redis-server on %s exited during start-up:\n%s", addr, log)
		default:
		}
		if rdb.Ping(context.Background()).Err() == nil {
			t.Cleanup(stop)
			return addr, nil
		}
		if time.Now().After(deadline) {
			stop()
			log, _ := os.ReadFile(logPath)
			return "", fmt.Errorf("redis-server on %s not ready after 10s:\n%s", addr, log)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
