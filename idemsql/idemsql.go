// Package idemsql commits an operation's effect and its outcome in one
// database transaction, for side effects that live in your SQL database.
//
// idem keeps its records in Redis, so on its own it cannot commit them with
// a change in your database: a process that dies after the change committed
// and before idem stored the result in Redis, or a Redis that loses the
// record (a failover before replication), lets the next attempt run the
// change again. Tx closes that gap. Call it inside idem.Do, or inside a
// handler under Guard.Middleware (idem.AttemptFrom), with the attempt:
//
//	receipt, err := idem.Do(ctx, g, key, req, func(ctx context.Context, a *idem.Attempt) (Receipt, error) {
//		return idemsql.Tx(ctx, db, a, func(ctx context.Context, tx *sql.Tx) (Receipt, error) {
//			// the effect, on tx only
//		})
//	})
//
// Tx writes the operation's outcome row (table idem_outcomes, primary key
// Attempt.ID) first in the transaction, then runs fn, then stores fn's
// result on the row and commits. So:
//
//   - The effect and the outcome commit together or not at all. An error or
//     a panic from fn, or a failed commit, rolls both back.
//   - Attempts of one operation serialise on the database's unique key. One
//     whose insert meets a committed outcome does not run fn and returns the
//     committed result; one whose insert meets an uncommitted outcome waits
//     for that transaction to end. This holds whatever Redis says: after a
//     crash between the commit and Redis's complete, after Redis lost the
//     record, and for a stale holder that froze past its lease while its
//     successor ran (its context is cancelled, which rolls its transaction
//     back; even a holder that ignores its context cannot commit a second
//     effect).
//   - Redis still decides the race and serves the replays: a repeat of a
//     completed operation never reaches the database.
//
// A holder that freezes inside its transaction (a GC pause, SIGSTOP, a VM
// migration) keeps its outcome row locked: its successor waits until that
// transaction ends, when the process resumes and its cancelled context rolls
// back, or when the process dies and the database ends its session. Have
// the database end forgotten transactions (PostgreSQL:
// idle_in_transaction_session_timeout) and keep fn short: the transaction is
// open while it runs, and on SQLite it holds the database's write lock.
//
// Redis stays the only place where the request fingerprint is compared
// (idem.ErrMismatch): the outcome row keeps the key and the result, not the
// request.
//
// # Results
//
// Tx stores fn's result the way idem.Do stores one: a []byte or a string as
// is, any other type as JSON, in the result column (bytea, BLOB); a
// committed result is decoded into T the same way. Use one Tx, with one T,
// per operation: a second Tx in the same operation would find the first one's
// outcome and return it.
//
// # Errors
//
// Tx returns fn's error unchanged (wrapped errors included; an
// idem.Permanent error too, which idem.Do stores in Redis only: the database
// keeps nothing of an attempt that failed). Its own errors start with
// "idem: " and wrap the driver's error.
//
// # Cost
//
// Two statements in the effect's transaction beyond the effect's own: the
// outcome's insert before fn and its update after. A repeat answered by
// Redis costs the database nothing; a retry that Redis cannot answer costs a
// transaction with one insert, rolled back, and one read.
//
// # Dialects and retention
//
// PostgreSQL and SQLite (3.24 or newer). Tx's statements are the same on
// both ($n placeholders, INSERT … ON CONFLICT DO NOTHING); the schema and
// Sweep differ, and CreateTable and Sweep detect the dialect. Outcomes are
// deleted by Sweep, never by Tx: see Sweep for the retention rule. Outcomes
// outlive Redis's records by design: until it is swept, an operation whose
// Redis record expired is answered from its outcome instead of running
// again.
package idemsql

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/idemkit/idem"
)

// Table is the name of the outcomes table.
const Table = "idem_outcomes"

// Statements of Tx, the same on PostgreSQL and SQLite.
const (
	insertOutcome = `INSERT INTO idem_outcomes (id, key, fence) VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING`
	updateOutcome = `UPDATE idem_outcomes SET result = $2 WHERE id = $1`
	selectOutcome = `SELECT fence, result FROM idem_outcomes WHERE id = $1`
)

// maxTries bounds how often Tx starts over when an outcome it met on insert
// was gone when it read it (swept in between).
const maxTries = 3

// Tx runs fn in one transaction on db that also records the operation's
// outcome (a.ID, a.Key, a.Fence and fn's result) under a unique key; if an
// earlier attempt of the operation already committed, fn does not run and
// that attempt's result is returned. See the package documentation for the
// guarantees.
//
// fn must do its work on tx, not on db, and should honour ctx: the attempt's
// context is cancelled when its lease is lost, which rolls the transaction
// back. The transaction has the database's default isolation level.
//
// Tx returns fn's error, after rolling back; an error of its own (starting,
// recording or committing the transaction, reading a committed outcome, or a
// result that is not JSON-encodable) is wrapped with an "idem: " message. A
// failed commit leaves the outcome unknown to the caller, not to the next
// attempt: its insert finds out.
func Tx[T any](ctx context.Context, db *sql.DB, a *idem.Attempt, fn func(ctx context.Context, tx *sql.Tx) (T, error)) (T, error) {
	var zero T
	switch {
	case db == nil:
		return zero, errors.New("idem: Tx with a nil *sql.DB")
	case a == nil || a.ID == "":
		return zero, errors.New("idem: Tx without the operation's Attempt")
	case fn == nil:
		return zero, errors.New("idem: Tx with a nil function")
	}
	for range maxTries {
		v, done, err := try(ctx, db, a, fn)
		if done {
			return v, err
		}
	}
	return zero, fmt.Errorf("idem: the outcome of operation %s vanished %d times between insert and read", a.ID, maxTries)
}

// try makes one attempt at Tx. done is false when an outcome met on insert
// was gone when read, and Tx should start over.
func try[T any](ctx context.Context, db *sql.DB, a *idem.Attempt, fn func(ctx context.Context, tx *sql.Tx) (T, error)) (v T, done bool, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return v, true, fmt.Errorf("idem: begin transaction: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback() // also when fn panics
		}
	}()
	res, err := tx.ExecContext(ctx, insertOutcome, a.ID, a.Key, a.Fence)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err != nil || n == 0 {
		// Another attempt's outcome is committed, or (an insert error under
		// a stricter isolation level) may be: read it outside this
		// transaction, whose snapshot may predate it.
		_ = tx.Rollback()
		return readOutcome[T](ctx, db, a.ID, err)
	}
	if v, err = fn(ctx, tx); err != nil {
		return v, true, err
	}
	b, err := encode(v)
	if err != nil {
		return v, true, err
	}
	if _, err := tx.ExecContext(ctx, updateOutcome, a.ID, b); err != nil {
		return v, true, fmt.Errorf("idem: record outcome: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return v, true, fmt.Errorf("idem: commit: %w", err)
	}
	committed = true
	return v, true, nil
}

// readOutcome returns the committed outcome of id. insertErr is the error of
// the insert that led here, if any: without a committed outcome it is the
// error to return.
func readOutcome[T any](ctx context.Context, db *sql.DB, id string, insertErr error) (v T, done bool, err error) {
	var (
		fence  int64
		result []byte // NULL is an empty result: modernc.org/sqlite stores an empty []byte so
	)
	err = db.QueryRowContext(ctx, selectOutcome, id).Scan(&fence, &result)
	switch {
	case insertErr != nil && err == nil:
		// The insert failed for another reason than the outcome, which is
		// committed anyway: answer it.
	case insertErr != nil:
		return v, true, fmt.Errorf("idem: record outcome: %w", insertErr)
	case errors.Is(err, sql.ErrNoRows):
		return v, false, nil // swept in between: start over
	case err != nil:
		return v, true, fmt.Errorf("idem: read committed outcome: %w", err)
	}
	v, err = decode[T](result)
	if err != nil {
		return v, true, fmt.Errorf("idem: committed outcome of operation %s (fence %d): %w", id, fence, err)
	}
	return v, true, nil
}

// encode stores v as idem.Do does: a []byte or string as is, else JSON.
func encode[T any](v T) ([]byte, error) {
	switch raw := any(v).(type) {
	case []byte:
		return append([]byte{}, raw...), nil // never nil: a nil result is still a result
	case string:
		return []byte(raw), nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("idem: result of type %T is not JSON-encodable: %w", v, err)
	}
	return b, nil
}

// decode is the inverse of encode.
func decode[T any](b []byte) (T, error) {
	var v T
	switch p := any(&v).(type) {
	case *[]byte:
		*p = b
		return v, nil
	case *string:
		*p = string(b)
		return v, nil
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return v, fmt.Errorf("result does not decode into %T: %w", v, err)
	}
	return v, nil
}
