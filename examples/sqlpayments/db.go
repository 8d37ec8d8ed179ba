package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // PostgreSQL, for -db postgres://…
	_ "modernc.org/sqlite"             // SQLite, pure Go: the default

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/paydemo"
	"github.com/idemkit/idem/idemsql"
)

// database is the replicas' shared SQL database: the ledger where each
// payment is booked, and idemsql's outcomes, committed together. It is the
// demo's paydemo.Ledger.
type database struct {
	*sql.DB
	desc string // for people: "SQLite /tmp/…/payments.db"
}

var _ paydemo.Ledger = (*database)(nil)

// ledgerSchema is the ledger: one entry per booked payment. It has no
// unique key of its own (a ledger appends), so only idemsql keeps a
// retried payment from being booked twice.
const ledgerSchema = `CREATE TABLE IF NOT EXISTS ledger (
	operation TEXT NOT NULL,
	charge_id TEXT NOT NULL,
	account   TEXT NOT NULL,
	amount    BIGINT NOT NULL,
	currency  TEXT NOT NULL
)`

// openDatabase opens the database named by s: a postgres:// or
// postgresql:// URL, a SQLite file (a path or a file: URI), or, when s is
// empty, a SQLite database in a temporary directory that stop removes. It
// creates the tables if they do not exist.
func openDatabase(ctx context.Context, s string) (db *database, stop func(), err error) {
	stop = func() {}
	driver, dsn, desc := "sqlite", s, "SQLite "+s
	switch {
	case strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://"):
		driver, desc = "pgx", "PostgreSQL"
	case s == "":
		dir, err := os.MkdirTemp("", "payments-")
		if err != nil {
			return nil, nil, err
		}
		stop = func() { _ = os.RemoveAll(dir) }
		s = filepath.Join(dir, "payments.db")
		dsn, desc = sqliteDSN(s), "SQLite "+s+", temporary"
	case !strings.HasPrefix(s, "file:"):
		dsn = sqliteDSN(s)
	}
	sdb, err := sql.Open(driver, dsn)
	if err != nil {
		stop()
		return nil, nil, err
	}
	db = &database{DB: sdb, desc: desc}
	prev := stop
	stop = func() { _ = sdb.Close(); prev() }
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := idemsql.CreateTable(cctx, sdb); err != nil {
		stop()
		return nil, nil, fmt.Errorf("database %s: %w", desc, err)
	}
	if _, err := sdb.ExecContext(cctx, ledgerSchema); err != nil {
		stop()
		return nil, nil, fmt.Errorf("database %s: create the ledger: %w", desc, err)
	}
	return db, stop, nil
}

// sqliteDSN opens a SQLite file in WAL mode, where writers wait for the
// write lock (busy_timeout) instead of failing at once.
func sqliteDSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"
}

// Book runs charge and books its charge in one transaction with the
// operation's outcome (idemsql.Tx). Its outcome row, inserted first, makes a
// second attempt wait for this one; if an earlier attempt already committed
// (it died before Redis heard of it, or Redis lost the record), charge does
// not run and the committed charge is returned. An attempt whose ctx ends
// (its lease lost) rolls back.
func (db *database) Book(ctx context.Context, at *idem.Attempt, account string, charge func(ctx context.Context) (paydemo.Charge, error)) (paydemo.Charge, bool, error) {
	ran := false
	c, err := idemsql.Tx(ctx, db.DB, at, func(ctx context.Context, tx *sql.Tx) (paydemo.Charge, error) {
		ran = true
		c, err := charge(ctx)
		if err != nil {
			return paydemo.Charge{}, err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO ledger (operation, charge_id, account, amount, currency) VALUES ($1, $2, $3, $4, $5)`,
			at.ID, c.ID, account, c.Amount, c.Currency); err != nil {
			return paydemo.Charge{}, fmt.Errorf("book the payment: %w", err)
		}
		return c, nil
	})
	return c, ran, err
}

// Entries returns the number of payments booked.
func (db *database) Entries(ctx context.Context) (int, error) {
	var n int
	err := db.QueryRowContext(ctx, `SELECT count(*) FROM ledger`).Scan(&n)
	return n, err
}

func (db *database) String() string { return "one database (" + db.desc + ")" }
