package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idemsql"
)

// sqlPool returns a database/sql handle on a pgx pool of clients
// connections whose statements are counted, so that every variant of the
// scenario has a pool and a count of its own.
func sqlPool(ctx context.Context, e *env, clients int) (*sql.DB, *queryCounter, error) {
	pcfg, err := pgxpool.ParseConfig(e.pgDSN)
	if err != nil {
		return nil, nil, err
	}
	qc := &queryCounter{}
	pcfg.ConnConfig.Tracer = qc
	pcfg.MaxConns = int32(clients)
	pcfg.MinConns = int32(clients)
	pcfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, err
	}
	db := stdlib.OpenDBFromPool(pool)
	db.SetMaxOpenConns(clients)
	db.SetMaxIdleConns(clients)
	e.onClose(func() { db.Close(); pool.Close() })
	return db, qc, nil
}

// sqlDesignDB is sqlDesign (scenario 3) through database/sql, the driver
// path idemsql takes, so that the two differ only in the mechanism.
func sqlDesignDB(ctx context.Context, db *sql.DB, key string, req payReq, resp []byte) ([]byte, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	hash := hex.EncodeToString(sum[:])
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx, `INSERT INTO idem_bench_keys (key, request_hash, status) VALUES ($1, $2, 'IN_PROGRESS') ON CONFLICT DO NOTHING`, key, hash)
	if err != nil {
		return nil, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return nil, errors.Join(errors.New("sql design: key exists (fresh keys only here)"), err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO idem_bench_payments (key, amount, currency) VALUES ($1, $2, $3)`, key, req.Amount, req.Currency); err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE idem_bench_keys SET status = 'COMPLETED', response_code = 201, response_body = $2 WHERE key = $1`, key, resp); err != nil {
		return nil, err
	}
	return resp, tx.Commit()
}

// benchEffect is the effect of the idem variants: the payment row of the
// SQL design, on tx.
func benchEffect(ctx context.Context, tx *sql.Tx, key string) (payment, error) {
	_, err := tx.ExecContext(ctx, `INSERT INTO idem_bench_payments (key, amount, currency) VALUES ($1, $2, $3)`, key, theReq.Amount, theReq.Currency)
	return thePayment, err
}

// runIdemSQL is scenario 3b: the design's transaction (effect and record
// commit together) with idem deciding the race in Redis and idemsql keeping
// the outcome in PostgreSQL, against the design's SQL table, and against
// idem with the same effect in a plain transaction (what idemsql adds).
func runIdemSQL(ctx context.Context, e *env) error {
	const title = "3b. The effect and its record in one transaction: idem + idemsql vs the SQL design on PostgreSQL"
	if e.pgDSN == "" {
		e.rep.section(title, "Skipped: "+e.pgNote)
		progress("scenario 3b: idemsql skipped: %s", e.pgNote)
		return nil
	}
	clients := e.cfg.clients
	progress("scenario 3b: idem + idemsql vs the SQL design, %d clients", clients)
	var dbs [4]*sql.DB
	var counts [4]*queryCounter
	for i := range dbs {
		var err error
		if dbs[i], counts[i], err = sqlPool(ctx, e, clients); err != nil {
			return err
		}
	}
	if _, err := dbs[0].ExecContext(ctx, sqlSchema); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	if err := idemsql.CreateTable(ctx, dbs[0]); err != nil {
		return err
	}
	if e.rep.pgVersion == "" { // scenario 3 did not run
		_ = dbs[0].QueryRowContext(ctx, "SHOW server_version").Scan(&e.rep.pgVersion)
	}
	// Outcome ids come from the keys alone: keys carry the run's nonce, and
	// the run's outcomes are deleted at the end (a -pg database may be shared).
	e.onClose(func() {
		for _, p := range []string{"t-", "o-"} {
			_, _ = dbs[0].ExecContext(context.Background(), `DELETE FROM idem_outcomes WHERE key LIKE $1`, p+e.nonce+"-%")
		}
	})

	sqlV, idemsqlV, plainV := idemSQLVariants(e, dbs, counts, clients)
	txOnlyV := txOnlyVariant(e, dbs[3], counts[3], clients)
	cfg := scaled(e.cfg, idemsqlScale)
	if err := compare(ctx, cfg, "idemsql", sqlV, idemsqlV, plainV, txOnlyV); err != nil {
		return err
	}
	sec := e.rep.section(title, fmt.Sprintf("%v per variant in %d rounds (-duration × %g: this comparison has no target). ", cfg.duration, cfg.rounds, idemsqlScale)+fmt.Sprintf("%d clients, fresh keys, a pgx pool of %d connections per variant, all through "+
		"database/sql (pgx's stdlib driver). The SQL design's keys are random UUIDs, as clients send them (idemsql's "+
		"outcome ids are hashes of the keys: random too). SQL design: scenario 3's transaction (claim `INSERT … ON CONFLICT DO NOTHING`, "+
		"the payment row, `UPDATE … COMPLETED`, COMMIT). idem + idemsql: `idem.Do` (claim and complete in Redis: 2 round "+
		"trips) around `idemsql.Tx`: BEGIN, the outcome row's `INSERT … ON CONFLICT DO NOTHING`, the same "+
		"payment row, the outcome's `UPDATE` with the result, COMMIT. The third row is `idem.Do` with the payment row in "+
		"a plain transaction (BEGIN, INSERT, COMMIT): the difference to it is what idemsql costs. The fourth row is "+
		"`idemsql.Tx` alone, without Redis (an Attempt made up per operation): its statements against the SQL design's. RT/op counts PostgreSQL "+
		"statements (pgx tracer) only. PostgreSQL %s, synchronous_commit=%s.",
		clients, clients, e.rep.pgVersion, e.cfg.pgSync))
	sec.pair(sqlV, idemsqlV)
	sec.pair(sqlV, txOnlyV)
	sec.pair(plainV, idemsqlV)
	return nil
}

// idemSQLVariants returns the scenario's variants, each on its own handle:
// the SQL design, idem + idemsql, and idem with a plain transaction.
func idemSQLVariants(e *env, dbs [4]*sql.DB, counts [4]*queryCounter, clients int) (sqlV, idemsqlV, plainV *variant) {
	// Random keys, as clients send them (a UUID per intent): the SQL
	// design's primary key is as scattered as idemsql's, whose ids are hashes.
	sqlV = &variant{name: "SQL design (database/sql)", clients: clients, rt: &counts[0].n,
		op: func(ctx context.Context, w int, seq uint64) error {
			_, err := sqlDesignDB(ctx, dbs[0], idemclient.NewKey(), theReq, rawPayload)
			return err
		}}
	rc, _ := e.client(0, clients)
	gTx := e.guard(rc, "t-"+e.nonce)
	txKeys := keyer("t-" + e.nonce)
	idemsqlV = &variant{name: "idem.Do + idemsql.Tx", clients: clients, rt: &counts[1].n,
		op: func(ctx context.Context, w int, seq uint64) error {
			key := txKeys.key(w, seq)
			_, err := idem.Do(ctx, gTx, key, theReq, func(ctx context.Context, a *idem.Attempt) (payment, error) {
				return idemsql.Tx(ctx, dbs[1], a, func(ctx context.Context, tx *sql.Tx) (payment, error) { return benchEffect(ctx, tx, key) })
			})
			return err
		}}
	pc, _ := e.client(0, clients)
	gPlain := e.guard(pc, "p-"+e.nonce)
	plainKeys := keyer("p-" + e.nonce)
	plainV = &variant{name: "idem.Do + plain transaction (no outcome row)", clients: clients, rt: &counts[2].n,
		op: func(ctx context.Context, w int, seq uint64) error {
			key := plainKeys.key(w, seq)
			_, err := idem.Do(ctx, gPlain, key, theReq, func(ctx context.Context, a *idem.Attempt) (payment, error) {
				return plainTx(ctx, dbs[2], key)
			})
			return err
		}}
	return sqlV, idemsqlV, plainV
}

// plainTx runs the payment row in a transaction of its own.
func plainTx(ctx context.Context, db *sql.DB, key string) (payment, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return payment{}, err
	}
	defer func() { _ = tx.Rollback() }()
	p, err := benchEffect(ctx, tx, key)
	if err != nil {
		return p, err
	}
	return p, tx.Commit()
}

// txOnlyVariant runs idemsql.Tx with the payment row and no Redis: the
// database's share of idem + idemsql.
func txOnlyVariant(e *env, db *sql.DB, qc *queryCounter, clients int) *variant {
	keys := keyer("o-" + e.nonce)
	return &variant{name: "idemsql.Tx alone (no Redis)", clients: clients, rt: &qc.n,
		op: func(ctx context.Context, w int, seq uint64) error {
			key := keys.key(w, seq)
			a := &idem.Attempt{Key: key, ID: key, Fence: 1}
			_, err := idemsql.Tx(ctx, db, a, func(ctx context.Context, tx *sql.Tx) (payment, error) { return benchEffect(ctx, tx, key) })
			return err
		}}
}

// idemsqlScale is the share of -duration each variant of scenario 3b
// measures (the full run has a time budget of about 5 minutes).
const idemsqlScale = 0.5
