package idemsql_test

// The crash window: the transaction committed and Redis never learned of
// it. Whatever Redis says next (the record unfinished with a higher fence,
// or no record at all), the retry answers the committed result and the
// effect stays one row.

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsql"
	"github.com/idemkit/idem/idemstore"
)

// failingStore fails Complete when told to, after the transaction
// committed: a process that dies, or a Redis that goes away, in between.
type failingStore struct {
	idemstore.Store
	failComplete atomic.Bool
}

var errInjected = errors.New("injected: connection reset")

func (s *failingStore) Complete(ctx context.Context, id, owner string, payload []byte, retention time.Duration) error {
	if s.failComplete.Load() {
		return errInjected
	}
	return s.Store.Complete(ctx, id, owner, payload, retention)
}

// TestCrashCompleteFails: Redis's complete fails after the commit. Do
// returns the result with ErrNotRecorded; once the lease runs out the
// retry (Fence 2) gets the committed result without running the effect,
// and completes the record in Redis.
func TestCrashCompleteFails(t *testing.T) {
	forEachDB(t, func(t *testing.T, d database) {
		const lease = time.Second
		ctx := context.Background()
		mr := miniredis.RunT(t)
		store := &failingStore{Store: miniStore(t, mr)}
		g := idem.New(store, quiet, idem.WithLease(lease))
		p := &payer{name: "complete"}
		fn := func(ctx context.Context, a *idem.Attempt) (string, error) { return idemsql.Tx(ctx, d.db, a, p.pay) }

		store.failComplete.Store(true)
		v, err := idem.Do(ctx, g, "key-complete", payReq{Amount: 7}, fn)
		require.ErrorIs(t, err, idem.ErrNotRecorded)
		require.ErrorIs(t, err, errInjected)
		require.Equal(t, "receipt-complete-1", v, "fn's value alongside ErrNotRecorded")
		// The completion goes on in the background until the lease ends:
		// the crash is that it never succeeds.
		require.NoError(t, g.Drain(ctx))
		store.failComplete.Store(false)

		// The failed completions made the store failing for g: calls are
		// refused at once until one goes out as a probe, a tenth of a
		// second later.
		for try := 0; ; try++ {
			_, err = idem.Do(ctx, g, "key-complete", payReq{Amount: 7}, fn)
			if !errors.Is(err, idem.ErrStoreUnavailable) || try == 50 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		require.ErrorIs(t, err, idem.ErrInProgress, "the claim stays until its lease runs out")
		mr.FastForward(lease + time.Millisecond)

		var fence int64
		v, err = idem.Do(ctx, g, "key-complete", payReq{Amount: 7}, func(ctx context.Context, a *idem.Attempt) (string, error) {
			fence = a.Fence
			return fn(ctx, a)
		})
		require.NoError(t, err)
		require.Equal(t, int64(2), fence, "Redis took the key over")
		require.Equal(t, "receipt-complete-1", v, "the committed result")
		require.Equal(t, int64(1), p.runs.Load(), "the effect did not run again")

		v, err = idem.Do(ctx, g, "key-complete", payReq{Amount: 7}, func(context.Context, *idem.Attempt) (string, error) {
			t.Error("a completed key ran again")
			return "", nil
		})
		require.NoError(t, err)
		require.Equal(t, "receipt-complete-1", v, "now replayed by Redis")
		require.Equal(t, 1, count(t, d.db, "payments"))
		require.Equal(t, []outcome{{Key: "key-complete", Fence: 1, Result: "receipt-complete-1"}}, readOutcomes(t, d.db))
	})
}

// TestCrashRedisFlushed: Redis loses everything (FLUSHALL: a failover
// before replication, a restart without persistence) between the commit and
// the complete. The retry is a fresh claim for Redis, Fence 1 again, and
// still gets the committed result.
func TestCrashRedisFlushed(t *testing.T) {
	forEachDB(t, func(t *testing.T, d database) {
		ctx := context.Background()
		g, mr := miniGuard(t)
		p := &payer{name: "flush"}
		v, err := idem.Do(ctx, g, "key-flush", payReq{Amount: 7}, func(ctx context.Context, a *idem.Attempt) (string, error) {
			v, err := idemsql.Tx(ctx, d.db, a, p.pay)
			mr.FlushAll() // committed; Redis forgets before the complete
			return v, err
		})
		require.ErrorIs(t, err, idem.ErrNotRecorded)
		require.ErrorIs(t, err, idem.ErrLeaseLost, "the record is gone: compare-and-complete refuses")
		require.Equal(t, "receipt-flush-1", v)

		for range 2 {
			var fence int64
			v, err = idem.Do(ctx, g, "key-flush", payReq{Amount: 7}, func(ctx context.Context, a *idem.Attempt) (string, error) {
				fence = a.Fence
				return idemsql.Tx(ctx, d.db, a, p.pay)
			})
			require.NoError(t, err)
			require.Equal(t, "receipt-flush-1", v)
			require.Equal(t, int64(1), fence, "a new record for Redis")
			mr.FlushAll() // and once more, after a clean complete
		}
		require.Equal(t, int64(1), p.runs.Load())
		require.Equal(t, 1, count(t, d.db, "payments"))
	})
}
