package paydemo

import (
	"context"
	"sync"

	"github.com/idemkit/idem"
)

// Ledger is where the replicas book payments: one entry per charge.
type Ledger interface {
	// Book runs charge for the operation at.ID and books the charge it
	// returns for account. ran reports whether charge ran: a ledger that
	// records operations (idemsql) answers an operation it already booked
	// with its charge, without running charge again. An attempt whose ctx
	// ends before the booking books nothing.
	Book(ctx context.Context, at *idem.Attempt, account string, charge func(ctx context.Context) (Charge, error)) (c Charge, ran bool, err error)
	// Entries returns the number of payments booked.
	Entries(ctx context.Context) (int, error)
	// String describes the ledger for people.
	String() string
}

// MemoryLedger is a ledger in the process's memory, shared by the replicas
// the process starts. It appends: only idem keeps a retried payment from
// being booked twice.
type MemoryLedger struct {
	mu      sync.Mutex
	entries []entry
}

type entry struct {
	operation, account string
	charge             Charge
}

// Book runs charge and appends its charge, unless ctx ended meanwhile (a
// replica that lost its lease books nothing, as a rolled-back transaction).
func (l *MemoryLedger) Book(ctx context.Context, at *idem.Attempt, account string, charge func(ctx context.Context) (Charge, error)) (Charge, bool, error) {
	c, err := charge(ctx)
	if err != nil {
		return Charge{}, true, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return Charge{}, true, err
	}
	l.entries = append(l.entries, entry{operation: at.ID, account: account, charge: c})
	return c, true, nil
}

// Entries returns the number of payments booked.
func (l *MemoryLedger) Entries(context.Context) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.entries), nil
}

func (l *MemoryLedger) String() string { return "an in-memory ledger" }
