package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// servers tracks every process the benchmark started, so that stop can end
// exactly those (by pid) and remove their temp dirs.
type servers struct {
	procs []*exec.Cmd
	stops []func() // run in reverse order by stop
	dirs  []string
}

func (s *servers) stop() {
	for i := len(s.stops) - 1; i >= 0; i-- {
		s.stops[i]()
	}
	s.stops = nil
	for _, c := range s.procs {
		stopProc(c)
	}
	s.procs = nil
	for _, d := range s.dirs {
		os.RemoveAll(d)
	}
	s.dirs = nil
}

// stopProc sends SIGTERM to the process it started and waits up to 5 s
// before SIGKILL.
func stopProc(c *exec.Cmd) {
	if c.Process == nil || c.ProcessState != nil {
		return
	}
	_ = c.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = c.Process.Kill()
		<-done
	}
}

// freePort returns a loopback TCP port that is free now, and whose
// port+10000 (the Redis Cluster bus port) is free too when bus is set.
func freePort(bus bool) (int, error) {
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !bus {
			return p, nil
		}
		if p+10000 > 65535 {
			continue
		}
		l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		if err != nil {
			continue
		}
		l2.Close()
		return p, nil
	}
	return 0, errors.New("no free port pair found")
}

func (s *servers) tempDir(pattern string) (string, error) {
	d, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", err
	}
	s.dirs = append(s.dirs, d)
	return d, nil
}

// startRedis starts one redis-server on 127.0.0.1 with no persistence and
// returns its address once it answers PING.
func (s *servers) startRedis(ctx context.Context, bin string, extra ...string) (string, error) {
	port, err := freePort(len(extra) > 0)
	if err != nil {
		return "", err
	}
	dir, err := s.tempDir("idem-bench-redis-")
	if err != nil {
		return "", err
	}
	args := []string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--protected-mode", "yes",
		"--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "no",
		"--logfile", filepath.Join(dir, "redis.log"), "--maxmemory-policy", "noeviction",
	}
	args = append(args, extra...)
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start %s: %w", bin, err)
	}
	s.procs = append(s.procs, cmd)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	if err := waitRedis(ctx, addr); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
		return "", fmt.Errorf("redis-server on %s: %w\n%s", addr, err, tail(string(log), 800))
	}
	return addr, nil
}

func waitRedis(ctx context.Context, addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Ping(ctx).Err()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startCluster starts three cluster-enabled masters and joins them with
// redis-cli --cluster create.
func (s *servers) startCluster(ctx context.Context, bin, cli string) ([]string, error) {
	var addrs []string
	for range 3 {
		dir, err := s.tempDir("idem-bench-cluster-")
		if err != nil {
			return nil, err
		}
		a, err := s.startRedis(ctx, bin, "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"), "--cluster-node-timeout", "5000")
		if err != nil {
			return nil, err
		}
		addrs = append(addrs, a)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, cli, args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, tail(string(out), 800))
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		for {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				return nil, fmt.Errorf("cluster node %s not ok: %v %s", a, err, info)
			}
			time.Sleep(100 * time.Millisecond)
		}
		c.Close()
	}
	return addrs, nil
}

// pgBins locates initdb, pg_ctl and postgres: on PATH, else in Debian's
// /usr/lib/postgresql/<v>/bin.
func pgBins() (dir string, err error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("pg_ctl"); err == nil {
			if r, err := filepath.EvalSymlinks(p); err == nil {
				return filepath.Dir(r), nil
			}
			return filepath.Dir(p), nil
		}
	}
	m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(m) > 0 {
		return filepath.Dir(m[len(m)-1]), nil
	}
	return "", errors.New("PostgreSQL binaries (initdb, pg_ctl) not found")
}

// startPostgres creates a throwaway cluster in a temp dir and starts it on
// 127.0.0.1. PostgreSQL refuses to run as root, so as root it runs as
// nobody (via runuser). synchronousCommit is passed through
// (default off: Redis here runs without persistence either).
func (s *servers) startPostgres(ctx context.Context, synchronousCommit string) (dsn string, err error) {
	bin, err := pgBins()
	if err != nil {
		return "", err
	}
	dir, err := s.tempDir("idem-bench-pg-")
	if err != nil {
		return "", err
	}
	port, err := freePort(false)
	if err != nil {
		return "", err
	}
	var prefix []string
	if os.Geteuid() == 0 {
		u, err := user.Lookup("nobody")
		if err != nil {
			return "", fmt.Errorf("running as root and no user nobody: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return "", err
		}
		runuser, err := exec.LookPath("runuser")
		if err != nil {
			return "", fmt.Errorf("running as root and no runuser: %w", err)
		}
		prefix = []string{runuser, "-u", "nobody", "--"}
	}
	run := func(timeout time.Duration, name string, args ...string) error {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		full := append(append([]string{}, prefix...), append([]string{filepath.Join(bin, name)}, args...)...)
		cmd := exec.CommandContext(cctx, full[0], full[1:]...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: %w\n%s", name, err, tail(string(out), 800))
		}
		return nil
	}
	data := filepath.Join(dir, "data")
	if err := run(60*time.Second, "initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale=C"); err != nil {
		return "", err
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c synchronous_commit=%s -c max_connections=200 -c shared_buffers=128MB",
		port, dir, synchronousCommit)
	if err := run(60*time.Second, "pg_ctl", "-D", data, "-l", filepath.Join(dir, "pg.log"), "-o", opts, "-w", "-t", "50", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "pg.log"))
		return "", fmt.Errorf("%w\n%s", err, tail(string(log), 800))
	}
	s.stops = append(s.stops, func() {
		if err := run(30*time.Second, "pg_ctl", "-D", data, "-m", "fast", "-w", "stop"); err != nil {
			fmt.Fprintln(os.Stderr, "bench: stopping PostgreSQL:", err)
		}
	})
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port), nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
