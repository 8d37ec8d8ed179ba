package idem

import (
	"context"
	"time"
)

type leaseEndKey struct{}

// ContextWithLeaseEnd returns a copy of ctx under which a claim holds its
// lease no later than end: the lease it takes is cut to end, and its
// heartbeats never renew it past end. A holder that stops at end, as an AWS
// Lambda instance killed or frozen at its invocation's deadline does, then
// blocks a retry of its key until end at most, not for a whole lease (see
// WithLease). Outside such a context a lease lasts as WithLease sets.
//
// contrib/idemlambda uses it with the invocation's deadline plus one
// second. A function still running at end loses its lease: its context is
// cancelled with cause ErrLeaseLost and its result is not stored.
func ContextWithLeaseEnd(ctx context.Context, end time.Time) context.Context {
	return context.WithValue(ctx, leaseEndKey{}, end)
}

// leaseEndFrom returns the end set by ContextWithLeaseEnd, if any.
func leaseEndFrom(ctx context.Context) (time.Time, bool) {
	end, ok := ctx.Value(leaseEndKey{}).(time.Time)
	return end, ok
}
