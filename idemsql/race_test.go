package idemsql_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsql"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/redistest"
)

// claimSpy reports the fence of every successful claim.
type claimSpy struct {
	idemstore.Store
	claims chan<- int64
}

func (s *claimSpy) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, id, c)
	if err == nil && res.Status == idemstore.ClaimOK {
		s.claims <- res.Fence
	}
	return res, err
}

// redisKind is a Redis that a test may flush.
type redisKind struct {
	name string
	open func(t *testing.T) (addr string, flush func())
}

var redisKinds = []redisKind{
	{name: "miniredis", open: func(t *testing.T) (string, func()) {
		mr := miniredis.RunT(t)
		return mr.Addr(), mr.FlushAll
	}},
	{name: "redis-server", open: func(t *testing.T) (string, func()) {
		srv := redistest.Start(t) // private: the test flushes it
		return srv.Addr(), func() { srv.FlushAll(t) }
	}},
}

// TestConcurrentGuardsRedisFlushed: 32 goroutines, spread over 2 Guards
// with their own Redis connections (two replicas), run one key at once and
// wait for the first result. While the first holder is inside its
// transaction, Redis loses everything; a waiter then claims the key afresh
// and its transaction meets the holder's uncommitted outcome row. The
// database's unique key decides: one effect row, and all 32 get its result.
func TestConcurrentGuardsRedisFlushed(t *testing.T) {
	for _, b := range backends {
		for _, r := range redisKinds {
			t.Run(b.name+"/"+r.name, func(t *testing.T) {
				t.Parallel()
				d := b.open(t)
				addr, flush := r.open(t)
				runCrowd(t, d, addr, flush)
			})
		}
	}
}

func runCrowd(t *testing.T, d database, addr string, flush func()) {
	const callers = 32
	ctx := context.Background()
	claims := make(chan int64, 2*callers)
	guards := spiedGuards(t, addr, claims)
	p := &payer{name: "crowd"}
	entered, release := make(chan struct{}), make(chan struct{})
	var enterOnce sync.Once
	effect := func(ctx context.Context, tx *sql.Tx) (string, error) {
		enterOnce.Do(func() { close(entered) })
		<-release
		return p.pay(ctx, tx)
	}
	type result struct {
		v   string
		err error
	}
	start := make(chan struct{})
	results := make(chan result, callers)
	for i := range callers {
		g := guards[i%2]
		go func() {
			<-start
			v, err := idem.Do(ctx, g, "key-crowd", payReq{Amount: 32}, func(ctx context.Context, a *idem.Attempt) (string, error) {
				return idemsql.Tx(ctx, d.db, a, effect)
			})
			results <- result{v: v, err: err}
		}()
	}
	close(start)
	require.Equal(t, int64(1), within(t, claims, 10*time.Second, "the first claim"))
	within(t, entered, 10*time.Second, "the first holder's effect")
	flush()
	require.Equal(t, int64(1), within(t, claims, 10*time.Second, "a claim after the flush"), "Redis forgot the key")
	if d.driver != "sqlite" {
		waitLockWaiters(t, d.db, "", 1) // the second holder's insert waits on the first's row
	}
	close(release)

	var notRecorded int
	for range callers {
		r := within(t, results, 30*time.Second, "a caller's result")
		require.Equal(t, "receipt-crowd-1", r.v, "error: %v", r.err)
		if r.err != nil {
			require.ErrorIs(t, r.err, idem.ErrNotRecorded)
			require.ErrorIs(t, r.err, idem.ErrLeaseLost, "the first holder's record was flushed")
			notRecorded++
		}
	}
	require.Equal(t, 1, notRecorded, "only the first holder could not record")
	require.Equal(t, int64(1), p.runs.Load(), "one effect")
	require.Equal(t, 1, count(t, d.db, "payments"), "one effect row")
	require.Len(t, claims, 0, "two claims in all")
}

// spiedGuards returns two Guards on the Redis at addr, each with a client
// of its own, that report their claims on claims. Their lease outlasts the
// test: only a flush lets another attempt in.
func spiedGuards(t *testing.T, addr string, claims chan<- int64) [2]*idem.Guard {
	t.Helper()
	var guards [2]*idem.Guard
	for i := range guards {
		c := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { _ = c.Close() })
		store := &claimSpy{Store: idem.NewRedisStore(c), claims: claims}
		// 32 callers on a pool of fewer connections, on a loaded machine:
		// the store timeout is far above any wait, so that only the race
		// under test decides.
		guards[i] = idem.New(store, quiet, idem.WithLease(10*time.Second), idem.WithWait(30*time.Second), idem.WithStoreTimeout(10*time.Second))
	}
	return guards
}

// waitLockWaiters polls PostgreSQL until at least n sessions on db's
// database (with application_name app, unless app is empty) wait for a lock.
func waitLockWaiters(t *testing.T, db *sql.DB, app string, n int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var waiting int
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'
			AND ($1 = '' OR application_name = $1)`, app).Scan(&waiting))
		if waiting >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions wait for a lock after 15s, want %d", waiting, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
