package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// SchemaPostgres creates the outcomes table and its index on PostgreSQL, for
// migration tools; CreateTable runs it. Each row is one committed operation:
// id is idem.Attempt.ID (22 characters), key the caller's key (for people
// reading the table), fence the attempt that committed, result the stored
// result (set before the commit; NULL is an empty result, which is how
// modernc.org/sqlite stores an empty []byte), created_at the database's clock
// at the insert, which Sweep follows. The fillfactor leaves room on each page
// for the update that stores the result, which then changes no index (a HOT
// update): under concurrent load it makes Tx's statements as cheap as the
// design's own SQL table.
const SchemaPostgres = `CREATE TABLE IF NOT EXISTS idem_outcomes (
	id         text PRIMARY KEY,
	key        text NOT NULL,
	fence      bigint NOT NULL,
	result     bytea,
	created_at timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 70);
CREATE INDEX IF NOT EXISTS idem_outcomes_created_at ON idem_outcomes (created_at);`

// SchemaSQLite is SchemaPostgres for SQLite (3.24 or newer, for ON CONFLICT):
// created_at is UTC text, YYYY-MM-DD HH:MM:SS, which sorts as it reads.
const SchemaSQLite = `CREATE TABLE IF NOT EXISTS idem_outcomes (
	id         TEXT PRIMARY KEY,
	key        TEXT NOT NULL,
	fence      INTEGER NOT NULL,
	result     BLOB,
	created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP
);
CREATE INDEX IF NOT EXISTS idem_outcomes_created_at ON idem_outcomes (created_at);`

// SweepBatch is how many outcomes each of Sweep's statements deletes at most.
const SweepBatch = 1000

// dialect is what differs between the supported databases.
type dialect struct {
	name   string
	schema string
	// sweep deletes at most $2 outcomes older than $1 seconds, oldest first,
	// along the index on created_at.
	sweep string
}

var (
	postgres = dialect{
		name:   "PostgreSQL",
		schema: SchemaPostgres,
		sweep: `DELETE FROM idem_outcomes WHERE id IN (SELECT id FROM idem_outcomes
			WHERE created_at < now() - make_interval(secs => $1) ORDER BY created_at LIMIT $2)`,
	}
	sqlite = dialect{
		name:   "SQLite",
		schema: SchemaSQLite,
		sweep: `DELETE FROM idem_outcomes WHERE id IN (SELECT id FROM idem_outcomes
			WHERE created_at < datetime('now', '-' || $1 || ' seconds') ORDER BY created_at LIMIT $2)`,
	}
)

// detect tells PostgreSQL from SQLite by asking the database (PostgreSQL
// first, so that it never logs the failed probe for SQLite).
func detect(ctx context.Context, db *sql.DB) (dialect, error) {
	var version string
	err := db.QueryRowContext(ctx, "SELECT version()").Scan(&version)
	switch {
	case err == nil && strings.Contains(version, "PostgreSQL"):
		return postgres, nil
	case err == nil:
		return dialect{}, fmt.Errorf("idem: unsupported database %q: idemsql supports PostgreSQL and SQLite", version)
	}
	if serr := db.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&version); serr == nil {
		return sqlite, nil
	}
	return dialect{}, fmt.Errorf("idem: detect the database (idemsql supports PostgreSQL and SQLite): %w", err)
}

// CreateTable creates the outcomes table and its index if they do not exist
// (SchemaPostgres or SchemaSQLite, by the database db is connected to).
func CreateTable(ctx context.Context, db *sql.DB) error {
	if db == nil {
		return errors.New("idem: CreateTable with a nil *sql.DB")
	}
	d, err := detect(ctx, db)
	if err != nil {
		return err
	}
	for stmt := range strings.SplitSeq(d.schema, ";") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("idem: create the outcomes table on %s: %w", d.name, err)
		}
	}
	return nil
}

// Sweep deletes outcomes created more than olderThan ago, by the database's
// clock, and returns how many it deleted. It deletes in batches of
// SweepBatch, oldest first, each batch a statement (and transaction) of its
// own along the index on created_at, so that it never holds many locks for
// long; it stops early, with ctx's error, when ctx ends. Run it on a
// schedule, from one process or many.
//
// The retention rule: keep outcomes longer than idem keeps records, so
// olderThan must exceed the Guard's retention plus its lease (idem.WithRetention,
// idem.WithLease: 24h and 30s by default). A Redis record can live that long
// after the transaction committed, unfinished (the process died before
// Redis's complete) or completed; while it lives, retries must still find the
// outcome. Longer is safer: for as long as an outcome is kept, a retry that
// Redis no longer knows about (its record expired or was lost) gets the
// committed result instead of running the effect again. A few times the
// retention (a week for the default day) costs one small row per operation.
// olderThan is rounded down to whole seconds; it must be at least a second.
func Sweep(ctx context.Context, db *sql.DB, olderThan time.Duration) (deleted int64, err error) {
	if db == nil {
		return 0, errors.New("idem: Sweep with a nil *sql.DB")
	}
	secs := int64(olderThan / time.Second)
	if secs < 1 {
		return 0, fmt.Errorf("idem: Sweep olderThan %v: must be at least a second, and longer than the retention", olderThan)
	}
	d, err := detect(ctx, db)
	if err != nil {
		return 0, err
	}
	for {
		res, err := db.ExecContext(ctx, d.sweep, secs, SweepBatch)
		if err != nil {
			return deleted, fmt.Errorf("idem: sweep outcomes: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return deleted, fmt.Errorf("idem: sweep outcomes: %w", err)
		}
		deleted += n
		if n < SweepBatch {
			return deleted, nil
		}
	}
}
