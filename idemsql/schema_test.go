package idemsql_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemsql"
)

// TestCreateTable: CreateTable may run again; the exported schema is what
// it runs, so a migration tool applying it gets the same table.
func TestCreateTable(t *testing.T) {
	forEachDB(t, func(t *testing.T, d database) {
		ctx := context.Background()
		require.NoError(t, idemsql.CreateTable(ctx, d.db), "a second run changes nothing")
		schema := idemsql.SchemaSQLite
		if d.driver != "sqlite" {
			schema = idemsql.SchemaPostgres
		}
		for stmt := range strings.SplitSeq(schema, ";") {
			if strings.TrimSpace(stmt) != "" {
				_, err := d.db.ExecContext(ctx, stmt)
				require.NoError(t, err, stmt)
			}
		}
		_, err := d.db.ExecContext(ctx, `INSERT INTO idem_outcomes (id, key, fence) VALUES ('a', 'k', 1)`)
		require.NoError(t, err)
		_, err = d.db.ExecContext(ctx, `INSERT INTO idem_outcomes (id, key, fence) VALUES ('a', 'k', 2)`)
		require.Error(t, err, "id is unique")
	})
}

// TestSweep: Sweep deletes outcomes older than its cutoff, in batches, and
// keeps the younger ones.
func TestSweep(t *testing.T) {
	forEachDB(t, func(t *testing.T, d database) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // Sweep ends with ctx
		defer cancel()
		const old = 2*idemsql.SweepBatch + 17 // three batches, the last one short
		insertOutcomes(t, d, "old", old, 3*24*time.Hour)
		insertOutcomes(t, d, "new", 5, time.Hour)
		n, err := idemsql.Sweep(ctx, d.db, 48*time.Hour)
		require.NoError(t, err)
		require.Equal(t, int64(old), n)
		require.Equal(t, 5, count(t, d.db, "idem_outcomes"))
		var left int
		require.NoError(t, d.db.QueryRowContext(ctx, `SELECT count(*) FROM idem_outcomes WHERE id LIKE 'new-%'`).Scan(&left))
		require.Equal(t, 5, left, "younger outcomes stay")

		n, err = idemsql.Sweep(ctx, d.db, 48*time.Hour)
		require.NoError(t, err)
		require.Zero(t, n)
		n, err = idemsql.Sweep(ctx, d.db, 30*time.Minute)
		require.NoError(t, err)
		require.Equal(t, int64(5), n)

		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err = idemsql.Sweep(cctx, d.db, time.Hour)
		require.ErrorIs(t, err, context.Canceled)
	})
}

// insertOutcomes inserts n outcomes created age ago, by the database's clock.
func insertOutcomes(t *testing.T, d database, prefix string, n int, age time.Duration) {
	t.Helper()
	ctx := context.Background()
	created := `now() - make_interval(secs => $3)`
	if d.driver == "sqlite" {
		created = `datetime('now', '-' || $3 || ' seconds')`
	}
	tx, err := d.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	stmt, err := tx.PrepareContext(ctx, `INSERT INTO idem_outcomes (id, key, fence, result, created_at) VALUES ($1, $2, 1, $4, `+created+`)`)
	require.NoError(t, err)
	for i := range n {
		_, err := stmt.ExecContext(ctx, fmt.Sprintf("%s-%d", prefix, i), "k", int64(age/time.Second), []byte("r"))
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit())
}
