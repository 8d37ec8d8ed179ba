package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/idemkit/idem"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// queryCounter is a pgx tracer counting statements (BEGIN and COMMIT
// included): each is one round trip to PostgreSQL.
type queryCounter struct{ n atomic.Int64 }

func (q *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	q.n.Add(1)
	return ctx
}

func (q *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

const sqlSchema = `
DROP TABLE IF EXISTS idem_bench_keys, idem_bench_payments;
CREATE TABLE idem_bench_keys (
	key           text PRIMARY KEY,
	request_hash  text NOT NULL,
	status        text NOT NULL CHECK (status IN ('IN_PROGRESS', 'COMPLETED')),
	response_code int,
	response_body bytea,
	created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE idem_bench_payments (
	id       bigserial PRIMARY KEY,
	key      text NOT NULL,
	amount   bigint NOT NULL,
	currency text NOT NULL
);`

var errSQLBusy = errors.New("sql design: key IN_PROGRESS (409)")

// sqlDesign performs one request the way the design document describes it
// for a SQL database, in one transaction: claim with INSERT … ON CONFLICT
// DO NOTHING; if the row was ours, run the effect (a row in idem_bench_payments) and mark
// COMPLETED with the response; otherwise read the row and replay, 409 or 422.
func sqlDesign(ctx context.Context, pool *pgxpool.Pool, key string, req payReq, resp []byte) ([]byte, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	hash := hex.EncodeToString(sum[:])
	var out []byte
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO idem_bench_keys (key, request_hash, status) VALUES ($1, $2, 'IN_PROGRESS') ON CONFLICT DO NOTHING`, key, hash)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			var h, status string
			var b []byte
			if err := tx.QueryRow(ctx, `SELECT request_hash, status, response_body FROM idem_bench_keys WHERE key = $1`, key).Scan(&h, &status, &b); err != nil {
				return err
			}
			switch {
			case h != hash:
				return errors.New("sql design: key reused with another request (422)")
			case status != "COMPLETED":
				return errSQLBusy
			}
			out = b
			return nil
		}
		if _, err := tx.Exec(ctx, `INSERT INTO idem_bench_payments (key, amount, currency) VALUES ($1, $2, $3)`, key, req.Amount, req.Currency); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE idem_bench_keys SET status = 'COMPLETED', response_code = 201, response_body = $2 WHERE key = $1`, key, resp); err != nil {
			return err
		}
		out = resp
		return nil
	})
	return out, err
}

// runSQL is scenario 3: the design's SQL table on PostgreSQL vs idem.Do.
func runSQL(ctx context.Context, e *env) error {
	if e.pgDSN == "" {
		e.rep.section("3. The SQL design on PostgreSQL", "Skipped: "+e.pgNote)
		progress("scenario 3: SQL skipped: %s", e.pgNote)
		return nil
	}
	clients := e.cfg.clients
	progress("scenario 3: SQL design vs idem, %d clients", clients)
	pcfg, err := pgxpool.ParseConfig(e.pgDSN)
	if err != nil {
		return err
	}
	qc := &queryCounter{}
	pcfg.ConnConfig.Tracer = qc
	pcfg.MaxConns = int32(clients)
	pcfg.MinConns = int32(clients)
	pcfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	e.onClose(pool.Close)
	if _, err := pool.Exec(ctx, sqlSchema); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	var version string
	if err := pool.QueryRow(ctx, "SHOW server_version").Scan(&version); err == nil {
		e.rep.pgVersion = version
	}

	sqlKeys := keyer("s-" + e.nonce)
	sqlV := &variant{name: "SQL design (PostgreSQL)", clients: clients, rt: &qc.n,
		op: func(ctx context.Context, w int, seq uint64) error {
			b, err := sqlDesign(ctx, pool, sqlKeys.key(w, seq), theReq, rawPayload)
			if err == nil && len(b) != len(rawPayload) {
				err = errors.New("sql design: wrong response")
			}
			return err
		}}

	rc, rh := e.client(0, clients)
	g := e.guard(rc, "q-"+e.nonce)
	var effects atomic.Int64
	doKeys := keyer("q")
	idemV := &variant{name: "idem.Do, fresh keys", clients: clients, rt: rh.n,
		op: func(ctx context.Context, w int, seq uint64) error {
			_, err := idem.Do(ctx, g, doKeys.key(w, seq), theReq, func(ctx context.Context, a *idem.Attempt) (payment, error) {
				effects.Add(1)
				return thePayment, nil
			})
			return err
		}}
	fc, fh := e.client(0, clients)
	floorV, _ := freshPair(e, "sql", clients, fc, fh, nil)
	floorV.name = "raw Redis 2-RT floor (SET NX PX + SET PX)"
	if err := compare(ctx, e.cfg, "SQL vs idem", sqlV, idemV, floorV); err != nil {
		return err
	}
	sec := e.rep.section("3. The SQL design on PostgreSQL vs idem",
		fmt.Sprintf("%d clients, fresh keys, pgxpool with %d connections. SQL side, one transaction per request: "+
			"`INSERT INTO idem_bench_keys … ON CONFLICT DO NOTHING` (claim), the effect (`INSERT INTO idem_bench_payments`), "+
			"`UPDATE … SET status='COMPLETED', response_code, response_body`, COMMIT; round trips are statements "+
			"(BEGIN and COMMIT included, pgx tracer). PostgreSQL %s runs with synchronous_commit=%s (Redis runs without "+
			"persistence). idem's effect is an in-process counter: the comparison is of the idempotency mechanism, "+
			"and the SQL side's effect row shares its transaction, which idem cannot offer. The third row is the raw "+
			"two-round-trip Redis floor of scenario 1, measured in the same rounds: the most any Redis design could reach here.",
			clients, clients, e.rep.pgVersion, e.cfg.pgSync))
	sec.pair(sqlV, idemV)
	sec.pair(sqlV, floorV)
	e.rep.ratioTarget(fmt.Sprintf("idem / SQL design throughput, %d clients", clients), "vs SQL design", idemV, sqlV, 5)
	return nil
}
