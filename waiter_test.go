package idem

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemstore"
)

// busyStore answers every claim that another attempt holds the key (for a
// minute more) and records when each claim was sent.
type busyStore struct {
	idemstore.Store // nil: only Claim is called
	mu              sync.Mutex
	claims          []time.Time
}

func (s *busyStore) Claim(context.Context, string, idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.claims = append(s.claims, time.Now())
	return idemstore.ClaimResult{Status: idemstore.ClaimBusy, RetryAfter: time.Minute}, nil
}

func (s *busyStore) sent() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.claims...)
}

// unwatchable is a busyStore whose Watch fails, as a RedisStore's does when
// its user may not subscribe.
type unwatchable struct{ *busyStore }

func (unwatchable) Watch(context.Context, string) (<-chan struct{}, func(), error) {
	return nil, nil, errors.New("no notifications here")
}

// watchable is a busyStore whose Watch succeeds; nobody ever notifies.
type watchable struct{ *busyStore }

func (watchable) Watch(context.Context, string) (<-chan struct{}, func(), error) {
	return make(chan struct{}), func() {}, nil
}

// TestWaiterPollPacing: a duplicate waiting on a store that cannot notify it
// (no Watcher, or a Watch that fails) claims again after 25ms, then every
// 50ms, never sooner, until its wait ends: it does not hammer the store the
// holder needs. Only lower bounds are asserted, which load cannot break.
func TestWaiterPollPacing(t *testing.T) {
	for name, wrap := range map[string]func(*busyStore) idemstore.Store{
		"no Watcher":   func(s *busyStore) idemstore.Store { return s },
		"Watch failed": func(s *busyStore) idemstore.Store { return unwatchable{s} },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := &busyStore{}
			g := New(wrap(s), quietLog, WithWait(400*time.Millisecond))
			_, err := Do(context.Background(), g, "k", nil, okFnInternal("never"))
			var ip *InProgressError
			require.ErrorAs(t, err, &ip)
			claims := s.sent()
			// The last claim is sent at the end of the wait, however near.
			require.GreaterOrEqual(t, len(claims), 3)
			for i := 1; i < len(claims)-1; i++ {
				least := 50 * time.Millisecond
				if i == 1 {
					least = 25 * time.Millisecond
				}
				require.GreaterOrEqual(t, claims[i].Sub(claims[i-1]), least, "claim %d of %d", i+1, len(claims))
			}
		})
	}
}

// TestWaiterClaimsOnceWatching: once its Watch succeeds, a waiter claims
// again at once, in case the holder completed between its claim and the
// subscription (which no notification would tell), and then waits for a
// notification or its own check after watchPoll, which a wait of 1s does not
// reach: three claims in all, the last at the end of the wait.
func TestWaiterClaimsOnceWatching(t *testing.T) {
	t.Parallel()
	s := &busyStore{}
	g := New(watchable{s}, quietLog, WithWait(time.Second))
	_, err := Do(context.Background(), g, "k", nil, okFnInternal("never"))
	var ip *InProgressError
	require.ErrorAs(t, err, &ip)
	require.Len(t, s.sent(), 3, "the first claim, the one after subscribing, the one at the end of the wait")
}
