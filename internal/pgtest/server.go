package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// startServer creates a cluster in a fresh directory and starts it,
// retrying on a fresh port when another process grabbed the chosen one.
func startServer(bin string) (s *Server, err error) {
	acct, err := runAccount()
	if err != nil {
		return nil, err
	}
	dir, err := makeDir(acct)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	if err := initdb(bin, dir, acct); err != nil {
		return nil, err
	}
	for range 5 {
		s = &Server{dir: dir, port: 0, bin: bin, acct: acct}
		if s.port, err = freePort(); err != nil {
			return nil, err
		}
		if err = s.launch(); !errors.Is(err, errAddrInUse) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	return s, nil
}

var errAddrInUse = errors.New("pgtest: address already in use")

// makeDir creates the server's directory, named after this process so that
// a later run can remove it once this process is gone, and owned by acct.
func makeDir(acct *account) (string, error) {
	sweepOnce.Do(sweepDirs)
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", dirPrefix, os.Getpid()))
	if err != nil {
		return "", err
	}
	if err := acct.own(dir); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("pgtest: give %s to user %s: %w", dir, acct.name, err)
	}
	return dir, nil
}

var sweepOnce sync.Once

// sweepDirs removes directories left by earlier test binaries.
func sweepDirs() {
	entries, _ := os.ReadDir(os.TempDir())
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), dirPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid == os.Getpid() || alive(pid) {
			continue
		}
		_ = os.RemoveAll(filepath.Join(os.TempDir(), e.Name()))
	}
}

// initdb creates the cluster in dir/data: trust authentication, superuser
// postgres, no fsync while creating.
func initdb(bin, dir string, acct *account) error {
	cmd := exec.Command(filepath.Join(bin, "initdb"), "-D", filepath.Join(dir, "data"),
		"-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync")
	cmd.Dir = dir
	acct.apply(cmd)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgtest: initdb (as %s): %w\n%s", acct.name, err, tail(string(out)))
	}
	return nil
}

// freePort returns a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) logPath() string { return filepath.Join(s.dir, "postgres.log") }

// launch starts postgres and waits until it accepts connections.
func (s *Server) launch() error {
	args := []string{
		"-D", filepath.Join(s.dir, "data"),
		"-p", strconv.Itoa(s.port),
		"-k", s.dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
		"-c", "max_connections=200",
		"-c", "shared_buffers=32MB",
	}
	proc, err := spawn(filepath.Join(s.bin, "postgres"), args, s.dir, s.logPath(), s.acct)
	if err != nil {
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	admin, err := sql.Open(Driver, s.DSN("postgres"))
	if err != nil {
		proc.kill(stopTimeout)
		return err
	}
	if err := s.waitReady(proc, admin); err != nil {
		_ = admin.Close()
		proc.kill(stopTimeout)
		return err
	}
	s.mu.Lock()
	s.proc, s.admin = proc, admin
	s.mu.Unlock()
	return nil
}

// waitReady pings until the server answers.
func (s *Server) waitReady(proc *process, admin *sql.DB) error {
	deadline := time.Now().Add(startTimeout)
	for {
		if proc.reap(false) {
			log := readLog(s.logPath())
			if strings.Contains(log, "Address already in use") {
				return errAddrInUse
			}
			return fmt.Errorf("pgtest: postgres on %s exited during startup:\n%s", s.Addr(), log)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := admin.PingContext(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtest: postgres on %s not ready after %v (last: %v):\n%s",
				s.Addr(), startTimeout, err, readLog(s.logPath()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readLog returns the tail of the server log, for error messages.
func readLog(path string) string {
	b, _ := os.ReadFile(path)
	return tail(string(b))
}

func tail(s string) string {
	if len(s) > 4000 {
		return "…" + s[len(s)-4000:]
	}
	return s
}

// stop shuts the server down (a fast shutdown, SIGKILL if it hangs) and
// removes its directory.
func (s *Server) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.admin != nil {
		_ = s.admin.Close()
		s.admin = nil
	}
	if s.proc != nil {
		s.proc.shutdown(stopTimeout)
		s.proc = nil
	}
	_ = os.RemoveAll(s.dir)
}
