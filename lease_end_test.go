package idem_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestLeaseEnd: a claim under ContextWithLeaseEnd takes a lease that ends
// by the context's end, not a whole lease later; a function still running
// at the end is not renewed past it and loses its lease, so that a retry
// after the end takes the key over as the next attempt.
func TestLeaseEnd(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t, idem.WithLease(time.Minute))
		ctx := context.Background()

		// The lease taken is cut to the end.
		end := time.Now().Add(2 * time.Second)
		_, err := idem.Do(idem.ContextWithLeaseEnd(ctx, end), g, "cut", "req", func(ctx context.Context, a *idem.Attempt) (string, error) {
			_, lease := b.store().Keys(a.ID)
			ttl := b.client.PTTL(ctx, lease).Val()
			require.Positive(t, ttl)
			require.LessOrEqual(t, ttl, 2*time.Second, "a lease cut to the end, not a minute")
			return "v", nil
		})
		require.NoError(t, err)

		// Without it, a whole lease.
		_, err = idem.Do(ctx, g, "whole", "req", func(ctx context.Context, a *idem.Attempt) (string, error) {
			_, lease := b.store().Keys(a.ID)
			require.Greater(t, b.client.PTTL(ctx, lease).Val(), 50*time.Second)
			return "v", nil
		})
		require.NoError(t, err)
	})
}

// TestLeaseEndNotRenewed: heartbeats never extend a lease past the end: the
// holder's function, still running, loses its lease at the end (its context
// ends with ErrLeaseLost), and a retry after the end runs as attempt 2.
func TestLeaseEndNotRenewed(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		if b.mr != nil {
			t.Skip("the end is wall-clock time; miniredis's keys expire by FastForward only")
		}
		const lease = 300 * time.Millisecond // renewed every 100ms
		g := b.guard(t, idem.WithLease(lease))
		end := time.Now().Add(600 * time.Millisecond)
		cause := make(chan error, 1)
		_, err := idem.Do(idem.ContextWithLeaseEnd(context.Background(), end), g, "k", "req", func(ctx context.Context, a *idem.Attempt) (string, error) {
			<-ctx.Done() // runs past the end, as a function killed at its deadline would
			cause <- context.Cause(ctx)
			return "", context.Cause(ctx)
		})
		require.ErrorIs(t, err, idem.ErrLeaseLost)
		require.ErrorIs(t, <-cause, idem.ErrLeaseLost, "fn is told, by the end (or earlier, should a renewal be late)")

		// Past the end (and the lease it was last renewed for), the key is
		// the next attempt's at once.
		time.Sleep(time.Until(end.Add(50 * time.Millisecond)))
		v, err := idem.Do(context.Background(), g, "k", "req", func(ctx context.Context, a *idem.Attempt) (int64, error) {
			return a.Fence, nil
		})
		require.NoError(t, err)
		require.EqualValues(t, 2, v)
	})
}
