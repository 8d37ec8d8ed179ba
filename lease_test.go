package idem

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemstore"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// beatStore records when each renewal was sent.
type beatStore struct {
	idemstore.Store
	mu    sync.Mutex
	beats []time.Time
	first chan struct{} // closed at the first renewal
	once  sync.Once
}

func (s *beatStore) Heartbeat(ctx context.Context, id, owner string, lease time.Duration) error {
	s.mu.Lock()
	s.beats = append(s.beats, time.Now())
	s.mu.Unlock()
	s.once.Do(func() { close(s.first) })
	return s.Store.Heartbeat(ctx, id, owner, lease)
}

// heartbeatCounter is a RedisStore that counts the renewals sent.
type heartbeatCounter struct {
	*RedisStore
	n atomic.Int32
}

func (s *heartbeatCounter) Heartbeat(ctx context.Context, id, owner string, lease time.Duration) error {
	s.n.Add(1)
	return s.RedisStore.Heartbeat(ctx, id, owner, lease)
}

func newBeatGuard(c *redis.Client, prefix string, lease time.Duration) (*Guard, *beatStore) {
	st := &beatStore{Store: NewRedisStore(c, WithPrefix(prefix)), first: make(chan struct{})}
	return New(st, WithLease(lease)), st
}

// TestHeartbeatStartsWhenDue: functions that finish before their first
// renewal is due never renew (a heartbeat started with fn would renew at
// once); one that runs on gets its first renewal no earlier than lease/4
// after its claim was sent (lease/3 by its timer), and keeps its lease.
func TestHeartbeatStartsWhenDue(t *testing.T) {
	forEachRawBackend(t, func(t *testing.T, b rawBackend) { testHeartbeatStartsWhenDue(t, b) })
}

func testHeartbeatStartsWhenDue(t *testing.T, b rawBackend) {
	const lease = 600 * time.Millisecond
	ctx := context.Background()
	// The short functions' first renewal is due 20s after their claim: they
	// finish before it however loaded the machine, so the count of renewals
	// is the whole proof.
	g, st := newBeatGuard(b.c, b.prefix, time.Minute)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := Do(ctx, g, "short-"+string(rune('a'+i%26))+string(rune('a'+i/26)), nil, func(context.Context, *Attempt) (int, error) { return i, nil })
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	st.mu.Lock()
	if n := len(st.beats); n != 0 {
		t.Fatalf("short functions renewed %d times", n)
	}
	st.mu.Unlock()

	g, st = newBeatGuard(b.c, b.prefix, lease)
	start := time.Now() // before the claim is sent
	_, err := Do(ctx, g, "long", nil, func(ctx context.Context, a *Attempt) (int, error) {
		select {
		case <-st.first:
		case <-time.After(5 * lease):
			t.Error("no renewal within 5 leases")
		}
		return 1, context.Cause(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if got := st.beats[0].Sub(start); got < lease/4 {
		t.Fatalf("first renewal %v after the claim, before lease/4", got)
	}
}

// failOnce is a store whose first renewal fails, as on a transient error.
type failOnce struct {
	idemstore.Store
	n atomic.Int32
}

func (s *failOnce) Heartbeat(ctx context.Context, id, owner string, lease time.Duration) error {
	if s.n.Add(1) == 1 {
		return errors.New("transient")
	}
	return s.Store.Heartbeat(ctx, id, owner, lease)
}

// TestHeartbeatRetriesSoon: a renewal that fails is tried again a tenth of
// the lease later, so that a transient error does not lose the lease of a
// function that runs on.
func TestHeartbeatRetriesSoon(t *testing.T) {
	forEachRawBackend(t, func(t *testing.T, b rawBackend) {
		const lease = 600 * time.Millisecond
		s := &failOnce{Store: NewRedisStore(b.c, WithPrefix(b.prefix))}
		g := New(s, quietLog, WithLease(lease))
		v, err := Do(context.Background(), g, "k", nil, func(ctx context.Context, a *Attempt) (string, error) {
			select {
			case <-ctx.Done():
				return "", context.Cause(ctx)
			case <-time.After(2 * lease):
				return "done", nil
			}
		})
		require.NoError(t, err)
		require.Equal(t, "done", v)
		require.GreaterOrEqual(t, s.n.Load(), int32(2))
	})
}

// nilBeats is a Store whose renewals answer at once.
type nilBeats struct{ idemstore.Store }

func (nilBeats) Heartbeat(context.Context, string, string, time.Duration) error { return nil }

// TestRenewAnsweredInTime: a renewal that answered is never taken for one
// that did not answer before the end of its lease, however the goroutines
// are scheduled. (Regression test: the renewal's context, cancelled once
// the answer was in, could win the race against the answer.)
func TestRenewAnsweredInTime(t *testing.T) {
	g := New(nilBeats{}, WithLease(time.Minute))
	var wg sync.WaitGroup
	var lost atomic.Int32
	for range 8 {
		wg.Go(func() {
			for range 2000 {
				if _, err := g.renew(t.Context(), "id", "o", g.lease); err != nil {
					lost.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.Zero(t, lost.Load(), "renewals that answered at once, reported as not answered")
}

// deadlineBeats is a Store whose renewals answer only when their context
// ends, with its error, as go-redis does with ContextTimeoutEnabled.
type deadlineBeats struct{ idemstore.Store }

func (deadlineBeats) Heartbeat(ctx context.Context, _, _ string, _ time.Duration) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestRenewClientGivesUp: a renewal whose client gives up at the deadline
// is a renewal that did not answer before the end of its lease (so the
// claim it renews counts as lost), not a store error.
func TestRenewClientGivesUp(t *testing.T) {
	g := New(deadlineBeats{}, WithLease(20*time.Millisecond))
	for range 10 {
		_, err := g.renew(t.Context(), "id", "o", g.lease)
		require.ErrorIs(t, err, errRenewTimeout)
	}
}
