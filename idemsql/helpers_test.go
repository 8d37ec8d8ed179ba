package idemsql_test

// Test helpers: the databases (SQLite through modernc.org/sqlite, a real
// PostgreSQL through internal/pgtest), Redis (miniredis, or a real
// redis-server through internal/redistest), and the effect every test
// counts: a row in table payments, which has no unique key of its own, so
// that only idemsql can keep it from being written twice.

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsql"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
)

// TestMain stops the shared PostgreSQL and redis-server when the tests are
// done.
func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	redistest.StopShared()
	os.Exit(code)
}

// database is a database under test: a handle and what a child process
// needs to open it too.
type database struct {
	db     *sql.DB
	driver string
	dsn    string
}

// backend opens a fresh database with the outcomes and payments tables.
type backend struct {
	name string
	open func(tb testing.TB) database
}

var (
	sqliteBackend   = backend{name: "sqlite", open: openSQLite}
	postgresBackend = backend{name: "postgres", open: openPostgres}
	backends        = []backend{sqliteBackend, postgresBackend}
)

// sqliteDSN opens path in WAL mode; concurrent writers wait for the write
// lock (busy_timeout) instead of failing at once.
func sqliteDSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)"
}

func openSQLite(t testing.TB) database {
	t.Helper()
	d := database{driver: "sqlite", dsn: sqliteDSN(filepath.Join(t.TempDir(), "idem.db"))}
	var err error
	d.db, err = sql.Open(d.driver, d.dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.db.Close() })
	setupTables(t, d.db)
	return d
}

func openPostgres(t testing.TB) database {
	t.Helper()
	d := database{driver: pgtest.Driver, dsn: pgtest.Shared(t).CreateDB(t)}
	d.db = pgtest.Open(t, d.dsn)
	setupTables(t, d.db)
	return d
}

func setupTables(t testing.TB, db *sql.DB) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, idemsql.CreateTable(ctx, db))
	_, err := db.ExecContext(ctx, `CREATE TABLE payments (op TEXT NOT NULL, receipt TEXT NOT NULL)`)
	require.NoError(t, err)
}

// forEachDB runs f as a parallel subtest on every backend.
func forEachDB(t *testing.T, f func(t *testing.T, d database)) {
	t.Helper()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			f(t, b.open(t))
		})
	}
}

// count returns the number of rows of table.
func count(t *testing.T, db *sql.DB, table string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRowContext(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

// outcome is a row of idem_outcomes.
type outcome struct {
	Key    string
	Fence  int64
	Result string
}

func readOutcomes(t *testing.T, db *sql.DB) []outcome {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), `SELECT key, fence, result FROM idem_outcomes ORDER BY key`)
	require.NoError(t, err)
	defer rows.Close()
	var out []outcome
	for rows.Next() {
		var o outcome
		var b []byte
		require.NoError(t, rows.Scan(&o.Key, &o.Fence, &b))
		o.Result = string(b)
		out = append(out, o)
	}
	require.NoError(t, rows.Err())
	return out
}

// payer is the effect: it inserts a payment row and returns its receipt,
// numbered by how many effects ran, so that a second effect could not
// answer like the first.
type payer struct {
	name string
	runs atomic.Int64
}

func (p *payer) pay(ctx context.Context, tx *sql.Tx) (string, error) {
	receipt := fmt.Sprintf("receipt-%s-%d", p.name, p.runs.Add(1))
	_, err := tx.ExecContext(ctx, `INSERT INTO payments (op, receipt) VALUES ($1, $2)`, p.name, receipt)
	return receipt, err
}

// payReq is the request every test fingerprints.
type payReq struct {
	Amount int `json:"amount"`
}

// quiet discards the engine's log.
var quiet = idem.WithLogger(slog.New(slog.DiscardHandler))

// miniGuard returns a guard on a fresh miniredis, and the server.
func miniGuard(t *testing.T, opts ...idem.Option) (*idem.Guard, *miniredis.Miniredis) {
	t.Helper()
	mr := miniredis.RunT(t)
	return idem.New(miniStore(t, mr), append([]idem.Option{quiet}, opts...)...), mr
}

// miniStore returns a store on mr with a client of its own.
func miniStore(t *testing.T, mr *miniredis.Miniredis) *idem.RedisStore {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return idem.NewRedisStore(c)
}

// within fails the test when ch does not deliver within d.
func within[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
	var zero T
	return zero
}
