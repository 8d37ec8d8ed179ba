package pgtest

import (
	"context"
	"database/sql"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMain stops the shared server when the tests are done, as the package
// documentation recommends.
func TestMain(m *testing.M) {
	code := m.Run()
	StopShared()
	os.Exit(code)
}

func TestSharedDatabasesAreApart(t *testing.T) {
	s := Shared(t)
	require.Same(t, s, Shared(t), "one server per test binary")
	ctx := context.Background()
	a, b := s.DB(t), s.DB(t)
	_, err := a.ExecContext(ctx, "CREATE TABLE x (n int)")
	require.NoError(t, err)
	_, err = b.ExecContext(ctx, "CREATE TABLE x (n int)")
	require.NoError(t, err, "each DB is a database of its own")

	var version, addr string
	require.NoError(t, a.QueryRowContext(ctx, "SELECT current_setting('server_version'), inet_server_addr()::text").Scan(&version, &addr))
	require.Equal(t, "127.0.0.1/32", addr)
	var fsync string
	require.NoError(t, a.QueryRowContext(ctx, "SHOW fsync").Scan(&fsync))
	require.Equal(t, "off", fsync)
	t.Logf("PostgreSQL %s on %s", version, s.Addr())
}

func TestDatabaseDroppedAtCleanup(t *testing.T) {
	s := Shared(t)
	var dsn string
	t.Run("inner", func(t *testing.T) { dsn = s.CreateDB(t) })
	db, err := sql.Open(Driver, dsn)
	require.NoError(t, err)
	defer db.Close()
	require.ErrorContains(t, db.PingContext(context.Background()), "does not exist")
}

func TestStartAndKill(t *testing.T) {
	s := Start(t)
	db := s.DB(t)
	require.NoError(t, db.PingContext(context.Background()))
	s.Kill(t)
	require.Error(t, db.PingContext(context.Background()), "the server is gone")
	require.NotEqual(t, Shared(t).Addr(), s.Addr())
}

// TestBinDir: a BinEnv that points nowhere is an error, not a silent
// fallback to another installation.
func TestBinDir(t *testing.T) {
	t.Setenv(BinEnv, t.TempDir())
	_, err := binDir()
	require.ErrorContains(t, err, "holds no initdb and postgres")
}
