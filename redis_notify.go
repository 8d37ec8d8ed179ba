package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem/idemstore"
	"github.com/redis/go-redis/v9"
)

var _ idemstore.Watcher = (*RedisStore)(nil)

// notifyChannel is the sharded Pub/Sub channel complete.lua and release.lua
// publish an operation's id on. It shares the record's hash tag, so on Redis
// Cluster it lives on the record's shard.
func (s *RedisStore) notifyChannel(id string) string { return s.keys(id)[0] + ":n" }

// subscribeTimeout bounds the wait for Redis to confirm a subscription.
const subscribeTimeout = time.Second

// Watch implements idemstore.Watcher with sharded Pub/Sub (SSUBSCRIBE, Redis 7.0):
// waiters share one subscriber connection per Redis node, opened by the
// first waiter and closed by the last. It returns once Redis confirmed the
// subscription. On a server without sharded Pub/Sub it returns an error and
// the engine polls.
func (s *RedisStore) Watch(ctx context.Context, id string) (<-chan struct{}, func(), error) {
	if err := s.usable(); err != nil {
		return nil, nil, err
	}
	ch := s.notifyChannel(id)
	node, c, err := s.nodeFor(ctx, ch)
	if err != nil {
		return nil, nil, err
	}
	if err := s.canWatch(ctx, c, ch); err != nil {
		return nil, nil, err
	}
	s.subsMu.Lock()
	if s.subs == nil {
		s.subs = make(map[string]*subscriber)
	}
	sub := s.subs[node]
	if sub == nil {
		sub = &subscriber{ps: c.SSubscribe(context.WithoutCancel(ctx)), waiters: map[string]map[chan struct{}]struct{}{},
			confirmed: map[string]chan struct{}{}, done: make(chan struct{})}
		go sub.read()
		s.subs[node] = sub
	}
	w := make(chan struct{}, 1)
	confirmed, first := sub.add(ch, w)
	s.subsMu.Unlock()

	stop := func() { s.unwatch(node, sub, ch, w) }
	if first {
		if err := sub.ps.SSubscribe(context.WithoutCancel(ctx), ch); err != nil {
			stop()
			return nil, nil, err
		}
	}
	t := time.NewTimer(subscribeTimeout)
	defer t.Stop()
	select {
	case <-confirmed:
		return w, stop, nil
	case <-sub.done:
		stop()
		return nil, nil, errors.New("idem: the subscriber connection closed")
	case <-t.C:
		stop()
		return nil, nil, errors.New("idem: Redis did not confirm the subscription")
	case <-ctx.Done():
		stop()
		return nil, nil, context.Cause(ctx)
	}
}

// errNoPubSub reports a server, or a user, without sharded Pub/Sub.
var errNoPubSub = errors.New("idem: sharded Pub/Sub is not available (Redis 7.0, and the ACL channels of the prefix); waiters poll")

// canWatch finds out once whether waiters can subscribe: it subscribes to
// ch on a connection of its own and reads the answer. A server without
// sharded Pub/Sub (an embedded test server) or a user refused the channel
// (ACL) makes every waiter poll from then on, without trying to subscribe
// each time; the refusal is logged once.
func (s *RedisStore) canWatch(ctx context.Context, c redis.UniversalClient, ch string) error {
	switch s.watchable.Load() {
	case 1:
		return nil
	case 2:
		return errNoPubSub
	}
	err := probeSubscribe(ctx, c, ch)
	var rerr redis.Error
	switch {
	case err == nil:
		s.watchable.Store(1)
		return nil
	case errors.As(err, &rerr):
		s.watchable.Store(2)
		if redis.HasErrorPrefix(err, "NOPERM") {
			s.notifyRefused(ctx, err)
		}
		return errNoPubSub
	}
	return err
}

// probeSubscribe subscribes to ch on a connection of its own and returns
// the server's answer: nil when the subscription is confirmed, the server's
// error reply when it is refused.
func probeSubscribe(ctx context.Context, c redis.UniversalClient, ch string) error {
	ctx, cancel := context.WithTimeout(ctx, subscribeTimeout)
	defer cancel()
	ps := c.SSubscribe(ctx)
	defer ps.Close()
	if err := ps.SSubscribe(ctx, ch); err != nil {
		return err
	}
	m, err := ps.Receive(ctx)
	if err != nil {
		return err
	}
	if sub, ok := m.(*redis.Subscription); !ok || sub.Kind != "ssubscribe" {
		return fmt.Errorf("idem: unexpected answer to SSUBSCRIBE: %v", m)
	}
	return nil
}

// nodeFor returns the client of the node serving channel ch, and a name
// for it.
func (s *RedisStore) nodeFor(ctx context.Context, ch string) (string, redis.UniversalClient, error) {
	cc, ok := s.c.(*redis.ClusterClient)
	if !ok {
		return "", s.c, nil
	}
	m, err := cc.MasterForKey(ctx, ch)
	if err != nil {
		return "", nil, err
	}
	return m.Options().Addr, m, nil
}

// unwatch removes waiter w of channel ch; the last waiter of a channel
// unsubscribes it, the last of a node closes its connection.
func (s *RedisStore) unwatch(node string, sub *subscriber, ch string, w chan struct{}) {
	s.subsMu.Lock()
	last, empty := sub.remove(ch, w)
	if empty && s.subs[node] == sub {
		delete(s.subs, node)
	}
	s.subsMu.Unlock()
	switch {
	case empty:
		_ = sub.ps.Close() // ends sub.read
	case last:
		_ = sub.ps.SUnsubscribe(context.Background(), ch)
	}
}

// subscriber is one Pub/Sub connection to a node and the waiters it serves.
type subscriber struct {
	ps   *redis.PubSub
	done chan struct{} // closed when read returns

	mu        sync.Mutex
	waiters   map[string]map[chan struct{}]struct{} // by channel
	confirmed map[string]chan struct{}              // closed when Redis confirms the channel's subscription
}

// add registers w on ch and reports whether w is its first waiter (who
// subscribes), with the channel closed once the subscription is confirmed.
func (sub *subscriber) add(ch string, w chan struct{}) (confirmed chan struct{}, first bool) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	ws := sub.waiters[ch]
	if ws == nil {
		ws = map[chan struct{}]struct{}{}
		sub.waiters[ch] = ws
		sub.confirmed[ch] = make(chan struct{})
		first = true
	}
	ws[w] = struct{}{}
	return sub.confirmed[ch], first
}

// remove unregisters w from ch, reporting whether ch has no waiter left and
// whether no channel has any.
func (sub *subscriber) remove(ch string, w chan struct{}) (last, empty bool) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	ws := sub.waiters[ch]
	delete(ws, w)
	if len(ws) == 0 {
		delete(sub.waiters, ch)
		delete(sub.confirmed, ch)
		last = true
	}
	return last, len(sub.waiters) == 0
}

// read dispatches confirmations and notifications until the connection is
// closed. go-redis reconnects and resubscribes by itself; a notification
// lost meanwhile is covered by the waiters' own checks.
func (sub *subscriber) read() {
	defer close(sub.done)
	for m := range sub.ps.ChannelWithSubscriptions() {
		sub.mu.Lock()
		switch m := m.(type) {
		case *redis.Subscription:
			if c := sub.confirmed[m.Channel]; c != nil && m.Kind == "ssubscribe" {
				select {
				case <-c:
				default:
					close(c)
				}
			}
		case *redis.Message:
			for w := range sub.waiters[m.Channel] {
				select {
				case w <- struct{}{}:
				default:
				}
			}
		}
		sub.mu.Unlock()
	}
}
