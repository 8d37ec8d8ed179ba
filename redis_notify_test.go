//go:build unix

package idem

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/redistest"
)

// TestWaiterIsNotified: a duplicate waiting 1.5s for the holder is woken
// by the completion, not by polling: it sends at most 5 commands in all
// (claim, SSUBSCRIBE, the claim that closes the race with a completion in
// between, the claim after the notification; the last waiter closes the
// subscriber connection), counted by a proxy on its connections, apart
// from the handshake go-redis makes when it opens a connection. The holder's fresh path sends no extra
// command when nobody waits.
func TestWaiterIsNotified(t *testing.T) {
	t.Parallel()
	for _, mode := range []clientMode{clientModes[0], clientModes[2]} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			testWaiterIsNotified(t, mode)
		})
	}
}

func testWaiterIsNotified(t *testing.T, mode clientMode) {
	r := newSlowRig(t)
	holder, _ := r.direct(t, WithLease(10*time.Second))
	waiter := r.slow(t, mode, WithWait(10*time.Second))
	ctx := context.Background()
	// The store asks once whether the server has sharded Pub/Sub.
	_, stop, err := waiter.store.(*RedisStore).Watch(ctx, "probe")
	require.NoError(t, err)
	stop()
	ws := &watchSignal{RedisStore: waiter.store.(*RedisStore), watching: make(chan struct{}, 1)}
	waiter.store = ws // the same store, which signals its subscription
	r.proxy.Commands()

	release := make(chan struct{})
	claimed := make(chan struct{})
	var holderErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		_, holderErr = Do(ctx, holder, "k", faultReq{}, func(ctx context.Context, a *Attempt) (string, error) {
			close(claimed)
			<-release
			return "first", nil
		})
	})
	<-claimed
	var v string
	var waitErr error
	var woke time.Time
	wg.Go(func() {
		v, waitErr = Do(ctx, waiter, "k", faultReq{}, func(ctx context.Context, a *Attempt) (string, error) {
			return "second", nil
		})
		woke = time.Now()
	})
	select {
	case <-ws.watching: // subscribed
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not subscribe")
	}
	time.Sleep(1500 * time.Millisecond) // the wait being measured, not a synchronisation
	done := time.Now()
	close(release)
	wg.Wait()
	require.NoError(t, holderErr)
	require.NoError(t, waitErr)
	require.Equal(t, "first", v)
	cmds := r.proxy.Commands()
	total := 0
	for name, n := range cmds {
		switch name {
		case "HELLO", "CLIENT": // go-redis's handshake of the subscriber connection
		default:
			total += n
		}
	}
	require.LessOrEqual(t, total, 5, "commands sent by the waiter: %v", cmds)
	require.Equal(t, 1, cmds["SSUBSCRIBE"], "%v", cmds)
	t.Logf("waiter sent %v; woke %v after fn returned", cmds, woke.Sub(done).Round(time.Microsecond))

	// Nobody waits: a fresh Do and a replay send one script each.
	fresh := r.slow(t, mode)
	r.proxy.Commands()
	_, err = Do(ctx, fresh, "k2", faultReq{}, okFnInternal("x"))
	require.NoError(t, err)
	_, err = Do(ctx, fresh, "k2", faultReq{}, okFnInternal("x"))
	require.NoError(t, err)
	cmds = r.proxy.Commands()
	if mode.pipelined { // a new pipeline connection says hello first
		delete(cmds, "HELLO")
		delete(cmds, "CLIENT")
	}
	require.Equal(t, map[string]int{"EVALSHA": 3}, cmds, "claim, complete, replay")
}

// TestWaiterWakeUpLag: a subscribed waiter is woken by the completion's
// notification: it returns after one more claim, not at its own check 2s
// later (watchPoll); over 15 runs the median delay between a completion and
// the waiter's return is logged (polling gave 25–50ms; a notified waiter
// needs a Pub/Sub message and one claim).
func TestWaiterWakeUpLag(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	prefix := redistest.Prefix(t)
	holder, _ := faultGuard(srv.Client(t), prefix)
	ws := &watchSignal{RedisStore: NewRedisStore(srv.Client(t), WithPrefix(prefix)), watching: make(chan struct{}, 1)}
	waiter := New(ws, quietLog, WithWait(5*time.Second))
	ctx := context.Background()
	var lags []time.Duration
	for i := range 15 {
		key := "lag" + string(rune('a'+i))
		claimed, release := make(chan struct{}), make(chan struct{})
		var completed time.Time
		go func() {
			_, _ = Do(ctx, holder, key, faultReq{}, func(ctx context.Context, a *Attempt) (string, error) {
				close(claimed)
				<-release
				completed = time.Now() // fn returns: the completion follows
				return "v", nil
			})
		}()
		<-claimed
		ws.claims.Store(0)
		woke := make(chan time.Time)
		go func() {
			_, _ = Do(ctx, waiter, key, faultReq{}, okFnInternal("w"))
			woke <- time.Now()
		}()
		select { // subscribed: from now on a completion notifies it
		case <-ws.watching:
		case <-woke:
			t.Fatal("the waiter returned before the holder completed")
		}
		close(release)
		lags = append(lags, (<-woke).Sub(completed))
		require.LessOrEqual(t, ws.claims.Load(), int32(3), "the first claim, the one after subscribing, the one after the notification")
	}
	sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
	t.Logf("wake-up lag: median %v, max %v", lags[len(lags)/2], lags[len(lags)-1])
	// Woken by the notification, not by its own check watchPoll after its
	// last claim: a bound of half of watchPoll, hundreds of times the lag
	// expected, tells the two apart on any machine.
	require.Less(t, lags[len(lags)/2], watchPoll/2, "the waiter was not notified")
}

// watchSignal is a RedisStore that counts claims and signals each
// subscription Watch made.
type watchSignal struct {
	*RedisStore
	claims   atomic.Int32
	watching chan struct{}
}

func (s *watchSignal) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	s.claims.Add(1)
	return s.RedisStore.Claim(ctx, id, c)
}

func (s *watchSignal) Watch(ctx context.Context, id string) (<-chan struct{}, func(), error) {
	ch, stop, err := s.RedisStore.Watch(ctx, id)
	if err == nil {
		s.watching <- struct{}{}
	}
	return ch, stop, err
}

func okFnInternal(v string) func(context.Context, *Attempt) (string, error) {
	return func(context.Context, *Attempt) (string, error) { return v, nil }
}

// TestForgetNotifiesWaiters: a forced Forget of a held operation wakes its
// waiters at once (they claim the key as new), as a completion does.
func TestForgetNotifiesWaiters(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	s := NewRedisStore(srv.Client(t), WithPrefix(redistest.Prefix(t)))
	ctx := context.Background()
	id := OperationID(KindDo, "", "forgotten")
	res, err := s.Claim(ctx, id, idemstore.ClaimRequest{Owner: "o1", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	require.NoError(t, err)
	require.Equal(t, idemstore.ClaimOK, res.Status)
	notify, stop, err := s.Watch(ctx, id)
	require.NoError(t, err)
	defer stop()
	forgot, err := s.Forget(ctx, id, true)
	require.NoError(t, err)
	require.True(t, forgot)
	select {
	case <-notify:
	case <-time.After(10 * time.Second): // a hang guard, far above any poll interval
		t.Fatal("the waiter was not notified of the forced Forget")
	}
}

// TestWatchesShareOneConnection: watches of several keys share one
// subscriber; one ending leaves the others notified, and the last to end
// closes the connection.
func TestWatchesShareOneConnection(t *testing.T) {
	srv := redistest.Shared(t)
	c := srv.Client(t)
	s := NewRedisStore(c, WithPrefix(redistest.Prefix(t)))
	ctx := context.Background()
	notifyA, stopA, err := s.Watch(ctx, "a")
	require.NoError(t, err)
	notifyB, stopB, err := s.Watch(ctx, "b")
	require.NoError(t, err)
	stopA()
	require.NoError(t, c.SPublish(ctx, s.notifyChannel("b"), "c").Err())
	select {
	case <-notifyB:
	case <-time.After(10 * time.Second):
		t.Fatal("b's watch was not notified after a's ended")
	}
	select {
	case <-notifyA:
		t.Fatal("an ended watch was notified")
	default:
	}
	stopB()
	s.subsMu.Lock()
	defer s.subsMu.Unlock()
	require.Empty(t, s.subs, "the last watch closes the connection")
}
