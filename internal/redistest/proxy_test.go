package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestProxyDelaysReplies: a delayed reply arrives late although the server
// executed the command on time; other commands pass undelayed.
func TestProxyDelaysReplies(t *testing.T) {
	ctx := context.Background()
	s := Shared(t)
	key := Prefix(t) + ":k"
	p := StartProxy(t, s.Addr())
	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.Ping(ctx).Err())

	delayed := p.DelayReplies(MatchCommand("SET"), 300*time.Millisecond, 1)
	watch := s.Client(t)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- c.Set(ctx, key, "v", 0).Err() }()
	require.Eventually(t, func() bool { return watch.Get(ctx, key).Val() == "v" }, 2*time.Second, 5*time.Millisecond,
		"the server ran the SET before its reply came back")
	require.NoError(t, <-done)
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	require.Equal(t, 1, delayed())

	require.NoError(t, c.Set(ctx, key, "w", 0).Err())
	require.Equal(t, 1, delayed(), "the rule delays one reply only")

	p.SetDelay(0, 200*time.Millisecond)
	start = time.Now()
	require.Equal(t, "w", c.Get(ctx, key).Val())
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
	p.SetDelay(0, 0)
}

// TestProxyFreeze: a command sent while the proxy is frozen reaches the
// proxy but not the server; Thaw delivers it, and its reply.
func TestProxyFreeze(t *testing.T) {
	ctx := context.Background()
	s := Shared(t)
	key := Prefix(t) + ":k"
	p := StartProxy(t, s.Addr())
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), ReadTimeout: time.Minute})
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.Ping(ctx).Err())
	p.Commands()

	p.Freeze()
	done := make(chan error, 1)
	go func() { done <- c.Set(ctx, key, "v", 0).Err() }()
	sets := 0
	require.Eventually(t, func() bool { sets += p.Commands()["SET"]; return sets == 1 }, 10*time.Second, time.Millisecond,
		"the SET reached the proxy")
	watch := s.Client(t)
	require.Equal(t, redis.Nil, watch.Get(ctx, key).Err(), "the server did not get the SET")
	select {
	case err := <-done:
		t.Fatalf("the SET was answered through a frozen proxy: %v", err)
	default:
	}

	p.Thaw()
	require.NoError(t, <-done)
	require.Equal(t, "v", watch.Get(ctx, key).Val())
	p.Thaw() // without Freeze: nothing
	require.NoError(t, c.Set(ctx, key, "w", 0).Err())
}

// TestProxyFreezeClientGone: a command sent through a frozen proxy by a
// client that then gave up and closed its connection still reaches the
// server once the proxy thaws, as over TCP.
func TestProxyFreezeClientGone(t *testing.T) {
	ctx := context.Background()
	s := Shared(t)
	key := Prefix(t) + ":k"
	p := StartProxy(t, s.Addr())
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), ReadTimeout: 100 * time.Millisecond, MaxRetries: -1})
	require.NoError(t, c.Ping(ctx).Err())

	p.Freeze()
	require.Error(t, c.Set(ctx, key, "v", 0).Err(), "no answer through a frozen proxy")
	require.NoError(t, c.Close())
	watch := s.Client(t)
	require.Equal(t, redis.Nil, watch.Get(ctx, key).Err())

	p.Thaw()
	require.Eventually(t, func() bool { return watch.Get(ctx, key).Val() == "v" }, 10*time.Second, 5*time.Millisecond,
		"the SET reached the server after the thaw")
}
