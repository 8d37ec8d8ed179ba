// Package pgtest runs a real PostgreSQL server for tests.
//
// Shared starts one server per test binary, on first use, on a free
// 127.0.0.1 port in a temporary directory (initdb with trust authentication,
// the Unix socket in the same directory, fsync off), and tests keep apart by
// database: DB and CreateDB give each caller a fresh database of its own,
// dropped by the test's cleanup. Start runs a private server for a test that
// takes PostgreSQL down.
//
// PostgreSQL refuses to run as root. When the tests run as root (CI
// containers often do), initdb and postgres run as the user postgres (or
// nobody, when there is no postgres user), in a directory owned by that user.
//
// The binaries are looked up in $IDEM_POSTGRES_BIN, on PATH, and in Debian's
// /usr/lib/postgresql/<version>/bin, newest version first. When they are
// absent the tests that need them are skipped, or fail when
// IDEM_REQUIRE_POSTGRES=1 is set, so that a CI job cannot silently lose them.
//
// A server is stopped by the test's cleanup (Start) or by StopShared, which
// TestMain should call after m.Run; on Linux the kernel also kills the server
// when the test binary dies, and the next run removes its directory.
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
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
)

const (
	// RequireEnv names the environment variable that, set to 1, turns the
	// skip for missing PostgreSQL binaries into a test failure.
	RequireEnv = "IDEM_REQUIRE_POSTGRES"

	// BinEnv names the environment variable that may point to the directory
	// holding initdb and postgres.
	BinEnv = "IDEM_POSTGRES_BIN"

	// Driver is the database/sql driver name DB opens databases with (pgx).
	Driver = "pgx"

	skipServer = "PostgreSQL not found (initdb and postgres, on $" + BinEnv +
		", PATH or /usr/lib/postgresql/*/bin): install Debian's postgresql to run the PostgreSQL tests"

	startTimeout = 60 * time.Second
	stopTimeout  = 10 * time.Second
	dirPrefix    = "idem-pgtest-"
)

// A Server is a PostgreSQL server listening on 127.0.0.1. Its methods may be
// called from any goroutine.
type Server struct {
	dir  string // data/, the socket and postgres.log
	port int
	bin  string
	acct *account

	admin *sql.DB // the postgres database, for CREATE and DROP DATABASE
	dbSeq atomic.Int64

	mu   sync.Mutex
	proc *process
}

// Start starts a private server for one test and registers its termination
// with tb.Cleanup. It skips the test when PostgreSQL is absent (see
// RequireEnv). Starting takes a second or two (initdb); prefer Shared.
func Start(tb testing.TB) *Server {
	tb.Helper()
	bin := lookBin(tb)
	s, err := startServer(bin)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.stop)
	return s
}

// Shared state for the per-binary server.
var (
	sharedMu      sync.Mutex
	sharedServer  *Server
	sharedFailure error // sticky: a failed start is not retried by every test
)

// Shared returns a server shared by all tests of the test binary, starting
// it on first use. Tests must not take it down, and keep apart by database
// (DB, CreateDB). It skips the test like Start when PostgreSQL is absent.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	bin := lookBin(tb)
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedServer == nil && sharedFailure == nil {
		sharedServer, sharedFailure = startServer(bin)
	}
	if sharedFailure != nil {
		tb.Fatal(sharedFailure)
	}
	return sharedServer
}

// StopShared stops the shared server, if started, and removes its directory.
// Call it from TestMain after m.Run.
func StopShared() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedServer != nil {
		sharedServer.stop()
		sharedServer = nil
	}
	sharedFailure = nil
}

// lookBin finds the directory of initdb and postgres, or skips (fails, with
// RequireEnv) the test.
func lookBin(tb testing.TB) string {
	tb.Helper()
	dir, err := binDir()
	if err != nil {
		why := skipServer
		if os.Getenv(BinEnv) != "" {
			why = err.Error()
		}
		if os.Getenv(RequireEnv) == "1" {
			tb.Fatalf("%s (%s=1)", why, RequireEnv)
		}
		tb.Skip(why)
	}
	return dir
}

// binDir returns the directory holding initdb and postgres.
func binDir() (string, error) {
	has := func(dir string) bool {
		for _, name := range []string{"initdb", "postgres"} {
			if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if dir := os.Getenv(BinEnv); dir != "" {
		if has(dir) {
			return dir, nil
		}
		return "", fmt.Errorf("pgtest: %s=%s holds no initdb and postgres", BinEnv, dir)
	}
	if p, err := exec.LookPath("postgres"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil && has(filepath.Dir(r)) {
			return filepath.Dir(r), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return versionOf(b) - versionOf(a) })
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	return "", errors.New("pgtest: PostgreSQL binaries not found")
}

// versionOf returns the major version in /usr/lib/postgresql/<v>/bin.
func versionOf(dir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return v
}

// running reports whether the server was started and not killed or stopped.
func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil
}

// Addr returns the server's address, "127.0.0.1:port".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port returns the server's TCP port.
func (s *Server) Port() int { return s.port }

// Log returns the tail of the server's log.
func (s *Server) Log() string { return readLog(s.logPath()) }

// DSN returns the URL of database on the server, as user postgres (trust
// authentication, no TLS).
func (s *Server) DSN(database string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&connect_timeout=5", s.Addr(), database)
}

// CreateDB creates a fresh, empty database for tb, dropped by tb.Cleanup,
// and returns its DSN. A child process may connect to it too.
func (s *Server) CreateDB(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("t%d", s.dbSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("pgtest: create database %s: %v\n%s", name, err, s.Log())
	}
	tb.Cleanup(func() {
		if !s.running() {
			return // killed: the directory goes with the server
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := s.admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			tb.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	return s.DSN(name)
}

// DB creates a fresh database for tb (CreateDB) and opens it with the pgx
// driver; the handle is closed by tb.Cleanup, before the database is dropped.
func (s *Server) DB(tb testing.TB) *sql.DB {
	tb.Helper()
	return Open(tb, s.CreateDB(tb))
}

// Open opens dsn with the pgx driver and pings it; the handle is closed by
// tb.Cleanup.
func Open(tb testing.TB, dsn string) *sql.DB {
	tb.Helper()
	db, err := sql.Open(Driver, dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		tb.Fatalf("pgtest: open %s: %v", dsn, err)
	}
	return db
}

// Kill ends the server like a crash (an immediate shutdown: every session
// ends at once, uncommitted transactions are lost), for tests that take
// PostgreSQL down; it fails on the shared server.
func (s *Server) Kill(tb testing.TB) {
	tb.Helper()
	sharedMu.Lock()
	shared := s == sharedServer
	sharedMu.Unlock()
	if shared {
		tb.Fatal("pgtest: Kill on the shared server; use Start for a server a test takes down")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.kill(stopTimeout)
		s.proc = nil
	}
}
