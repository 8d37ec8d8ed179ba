//go:build unix

package idemsql_test

import (
	"context"
	"database/sql"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsql"
	"github.com/idemkit/idem/internal/redistest"
)

// childLease is the lease of the child processes: long enough that a loaded
// machine answers a claim well within it, short enough to wait out. The
// parent's own attempts take a long lease (parentLease): a lease is a
// property of each claim, and theirs is never waited out.
const (
	childLease  = time.Second
	parentLease = 10 * time.Second
)

// TestCrashChildKilledAfterCommit: a process commits the payment and its
// outcome and is SIGKILLed before Redis's complete. Once its lease runs out,
// the retry takes the key over (Fence 2) and answers the dead process's
// committed result without paying again.
func TestCrashChildKilledAfterCommit(t *testing.T) {
	forEachDB(t, func(t *testing.T, d database) {
		srv := redistest.Shared(t)
		prefix := redistest.Prefix(t)
		ctx := context.Background()

		c := startChild(t, "commit-then-die", d, srv.Addr(), prefix, childLease)
		require.Equal(t, int64(1), c.Next(t, "committed").Fence)
		c.Signal(t, syscall.SIGKILL)
		require.Error(t, c.Wait(t))

		g := idem.New(idem.NewRedisStore(srv.Client(t), idem.WithPrefix(prefix)), quiet,
			idem.WithLease(parentLease), idem.WithWait(10*time.Second))
		p := &payer{name: "parent"}
		var fence int64
		v, err := idem.Do(ctx, g, childKey, payReq{Amount: 100}, func(ctx context.Context, a *idem.Attempt) (string, error) {
			fence = a.Fence
			return idemsql.Tx(ctx, d.db, a, p.pay)
		})
		require.NoError(t, err)
		require.Equal(t, int64(2), fence, "the retry took the dead holder's key over")
		require.Equal(t, "receipt-child", v, "the committed result")
		require.Zero(t, p.runs.Load(), "the effect did not run again")

		v, err = idem.Do(ctx, g, childKey, payReq{Amount: 100}, func(context.Context, *idem.Attempt) (string, error) {
			t.Error("a completed key ran again")
			return "", nil
		})
		require.NoError(t, err)
		require.Equal(t, "receipt-child", v)
		require.Equal(t, 1, count(t, d.db, "payments"))
		require.Equal(t, []outcome{{Key: childKey, Fence: 1, Result: "receipt-child"}}, readOutcomes(t, d.db))
	})
}

// TestFrozenHolderBlockedBySuccessor: a process claims the key and is
// SIGSTOPped past its lease. Its successor takes the key over and inserts
// its outcome row; the frozen process resumes and runs its transaction
// regardless (on a context that ignores the lost lease), and its insert
// waits on the successor's row. The successor commits: the stale holder's
// insert finds the committed outcome, its effect never runs, and the table
// holds one payment.
func TestFrozenHolderBlockedBySuccessor(t *testing.T) {
	t.Parallel()
	d := openPostgres(t)
	srv := redistest.Shared(t)
	prefix := redistest.Prefix(t)
	ctx := context.Background()

	c := startChild(t, "frozen", d, srv.Addr(), prefix, childLease)
	require.Equal(t, int64(1), c.Next(t, "ready").Fence)
	c.Signal(t, syscall.SIGSTOP)

	g := idem.New(idem.NewRedisStore(srv.Client(t), idem.WithPrefix(prefix)), quiet,
		idem.WithLease(parentLease), idem.WithWait(10*time.Second))
	p := &payer{name: "successor"}
	inserted, commit, done := startSuccessor(ctx, g, d.db, p)
	select {
	case <-inserted: // the successor holds its uncommitted outcome row
	case r := <-done:
		t.Fatalf("the successor ended before its transaction: %+v", r)
	case <-time.After(15 * time.Second):
		t.Fatal("the successor did not take the key over")
	}

	c.Signal(t, syscall.SIGCONT)
	_, err := io.WriteString(c.Stdin, "go\n")
	require.NoError(t, err)
	waitLockWaiters(t, d.db, "idemsql-child", 1) // the stale holder's insert waits
	close(commit)

	r := within(t, done, 15*time.Second, "the successor's result")
	require.NoError(t, r.err)
	require.Equal(t, int64(2), r.fence)
	require.Equal(t, "receipt-successor-1", r.v)

	tx := c.Next(t, "tx")
	require.Empty(t, tx.Err)
	require.False(t, tx.Ran, "the stale holder's effect did not run")
	require.Equal(t, "receipt-successor-1", tx.Value, "it got the successor's committed result")
	res := c.Next(t, "result")
	require.Equal(t, "receipt-successor-1", res.Value)
	require.True(t, res.NotRecorded, "child error: %s", res.Err)
	require.True(t, res.LeaseLost, "child error: %s", res.Err)
	require.NoError(t, c.Wait(t), c.Stderr())

	require.Equal(t, 1, count(t, d.db, "payments"))
	require.Equal(t, []outcome{{Key: childKey, Fence: 2, Result: "receipt-successor-1"}}, readOutcomes(t, d.db))
}

// successorResult is what the successor's Do returned, and its fence.
type successorResult struct {
	v     string
	err   error
	fence int64
}

// startSuccessor runs Do on childKey in a goroutine, with p's effect in
// idemsql.Tx. Once the effect's row is inserted it closes inserted and
// waits, inside its transaction, until commit is closed.
func startSuccessor(ctx context.Context, g *idem.Guard, db *sql.DB, p *payer) (inserted <-chan struct{}, commit chan<- struct{}, done <-chan successorResult) {
	ins, com, res := make(chan struct{}), make(chan struct{}), make(chan successorResult, 1)
	go func() {
		var r successorResult
		r.v, r.err = idem.Do(ctx, g, childKey, payReq{Amount: 100}, func(ctx context.Context, a *idem.Attempt) (string, error) {
			r.fence = a.Fence
			return idemsql.Tx(ctx, db, a, func(ctx context.Context, tx *sql.Tx) (string, error) {
				v, err := p.pay(ctx, tx)
				close(ins)
				<-com
				return v, err
			})
		})
		res <- r
	}()
	return ins, com, res
}
