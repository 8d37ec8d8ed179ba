package idemsql_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsql"
)

// mustNotRun is a function that fails the test when it runs.
func mustNotRun(t *testing.T) func(context.Context, *sql.Tx) (string, error) {
	return func(context.Context, *sql.Tx) (string, error) {
		t.Error("fn ran")
		return "", nil
	}
}

// TestTxOwnErrors: Tx's own failures (starting the transaction, recording
// the outcome) are "idem: " errors wrapping the driver's, and fn does not
// run.
func TestTxOwnErrors(t *testing.T) {
	forEachDB(t, func(t *testing.T, d database) {
		a := &idem.Attempt{Key: "k", ID: "id-errors", Fence: 1}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := idemsql.Tx(ctx, d.db, a, mustNotRun(t))
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorContains(t, err, "idem: begin transaction: ")

		_, err = d.db.Exec(`DROP TABLE idem_outcomes`)
		require.NoError(t, err)
		_, err = idemsql.Tx(context.Background(), d.db, a, mustNotRun(t))
		require.ErrorContains(t, err, "idem: record outcome: ")
		require.ErrorContains(t, err, "idem_outcomes")
	})
}

// TestTxOutcomeVanishes: an outcome met on insert but gone when read (a
// Sweep in between) makes Tx start over, a bounded number of times. Here a
// trigger makes every insert a silent no-op, as if each met an outcome
// swept at once.
func TestTxOutcomeVanishes(t *testing.T) {
	d := openSQLite(t)
	_, err := d.db.Exec(`CREATE TRIGGER vanish BEFORE INSERT ON idem_outcomes BEGIN SELECT RAISE(IGNORE); END`)
	require.NoError(t, err)
	a := &idem.Attempt{Key: "k", ID: "id-vanish", Fence: 1}
	_, err = idemsql.Tx(context.Background(), d.db, a, mustNotRun(t))
	require.EqualError(t, err, "idem: the outcome of operation id-vanish vanished 3 times between insert and read")
}

// TestSchemaErrors: CreateTable and Sweep report a database they cannot
// use, and statements the database refuses.
func TestSchemaErrors(t *testing.T) {
	ctx := context.Background()
	closed, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "closed.db"))
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	require.ErrorContains(t, idemsql.CreateTable(ctx, closed), "idem: detect the database (idemsql supports PostgreSQL and SQLite): sql: database is closed")
	_, err = idemsql.Sweep(ctx, closed, time.Hour)
	require.ErrorContains(t, err, "idem: detect the database")

	d := openSQLite(t)
	ro, err := sql.Open("sqlite", d.dsn+"&_pragma=query_only(1)")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ro.Close() })
	_, err = ro.Exec(`DROP INDEX idem_outcomes_created_at`)
	require.Error(t, err, "read only")
	_, err = d.db.Exec(`DROP INDEX idem_outcomes_created_at`)
	require.NoError(t, err)
	require.ErrorContains(t, idemsql.CreateTable(ctx, ro), "idem: create the outcomes table on SQLite: ")
	_, err = idemsql.Sweep(ctx, ro, time.Hour)
	require.ErrorContains(t, err, "idem: sweep outcomes: ")
}

// TestSweepSecond: a second is the shortest olderThan, and a fraction of a
// second is rounded down (TestSweep: younger outcomes stay).
func TestSweepSecond(t *testing.T) {
	forEachDB(t, func(t *testing.T, d database) {
		// Sweep's loop ends with ctx: a Sweep that does not stop after
		// its last batch fails the test instead of hanging it.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		insertOutcomes(t, d, "old", 3, 2*time.Second)
		n, err := idemsql.Sweep(ctx, d.db, time.Second+999*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, int64(3), n, "older than a second")
		require.Zero(t, count(t, d.db, "idem_outcomes"))
		_, err = idemsql.Sweep(ctx, d.db, 999*time.Millisecond)
		require.ErrorContains(t, err, "idem: Sweep olderThan 999ms: must be at least a second")
	})
}
