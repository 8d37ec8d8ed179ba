package idemlambda_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemlambda"
	"github.com/idemkit/idem/internal/redistest"
)

func TestLeaseContextWithoutDeadline(t *testing.T) {
	type key struct{}
	ctx := context.WithValue(context.Background(), key{}, "v")
	require.Equal(t, ctx, idemlambda.LeaseContext(ctx), "no deadline, no invocation: the Guard's lease")
}

// A function that outlives its invocation's deadline (its instance frozen
// or stuck, its heartbeats still running) stops renewing its lease a second
// after the deadline: a retry then runs at once as the next attempt, and
// the late function's result is not stored.
func TestLeaseEndsWithInvocation(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	// A short lease, so that heartbeats renew it several times before the
	// invocation's end.
	quiet := idem.WithLogger(slog.New(slog.DiscardHandler)) // the late result's log
	a := newInstance(t, srv.Addr(), idem.WithLease(600*time.Millisecond), quiet)
	b := newInstance(t, srv.Addr(), idem.WithLease(600*time.Millisecond), quiet)

	lateID := make(chan string, 1)
	release := make(chan struct{})
	stuck := idemlambda.Handler(a.guard, orderKey, func(ctx context.Context, o Order) (Receipt, error) {
		at, _ := idem.AttemptFrom(ctx)
		lateID <- at.ID
		<-ctx.Done() // the deadline
		<-release    // and on, past it
		return Receipt{Charge: "late", Amount: o.Amount, Fence: at.Fence}, nil
	})
	c := &charger{}
	fresh := idemlambda.Handler(b.guard, orderKey, c.charge)
	order := Order{RequestID: "req-late", Amount: 1000}

	deadline := time.Now().Add(time.Second)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	first := make(chan error, 1)
	go func() {
		_, err := invoke(ctx, stuck, order)
		first <- err
	}()

	// 1.5 s after the deadline, the retry on another instance.
	time.Sleep(time.Until(deadline.Add(1500 * time.Millisecond)))
	body, err := invoke(context.Background(), fresh, order)
	require.NoError(t, err, "the lease ended a second after the deadline")
	require.Equal(t, int64(2), decode[Receipt](t, body).Fence)

	close(release)
	require.NoError(t, <-first, "the late function's own answer (idem.ErrNotRecorded, logged), which Lambda drops past the deadline")
	again, err := invoke(context.Background(), fresh, order)
	require.NoError(t, err)
	require.Equal(t, string(body), string(again), "the retry's answer is the one replayed")
	require.Equal(t, int32(1), c.charges.Load())

	_, leaseKey := idem.NewRedisStore(srv.Client(t)).Keys(<-lateID)
	require.Zero(t, srv.Client(t).Exists(context.Background(), leaseKey).Val(), "no lease left behind")
}

// The lease a claim takes is cut to the deadline plus a second, whatever
// the Guard's lease.
func TestLeaseCutToDeadline(t *testing.T) {
	forEachRedis(t, func(t *testing.T, addr string) {
		rdb := newRedisClient(t, addr)
		store := idem.NewRedisStore(rdb)
		g := idem.New(store, idem.WithLease(time.Minute))
		var left time.Duration
		deadline := time.Now().Add(3 * time.Second)
		limit := time.Until(deadline.Add(time.Second)) // before the claim
		fn := idemlambda.Handler(g, orderKey, func(ctx context.Context, o Order) (Receipt, error) {
			at, _ := idem.AttemptFrom(ctx)
			_, leaseKey := store.Keys(at.ID)
			pttl, err := rdb.PTTL(ctx, leaseKey).Result()
			if err != nil {
				return Receipt{}, err
			}
			if pttl > limit {
				return Receipt{}, errors.New("the lease outlives the deadline by more than a second: " + pttl.String())
			}
			left = pttl
			return Receipt{Amount: o.Amount}, nil
		})
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		_, err := invoke(ctx, fn, Order{RequestID: "req-cut", Amount: 1})
		require.NoError(t, err)
		require.Positive(t, left)
	})
}
