package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	stdlog "log"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/redistest"
)

// backend is one Redis the engine tests run against: miniredis, whose clock
// moves only when advanced, or a real redis-server.
type backend struct {
	client *redis.Client
	// options returns new options for the same server, for a test that
	// needs a client of its own: never client.Options(), which returns the
	// client's own, carrying its push notification processor (a client made
	// from them registers go-redis's handlers a second time, and says so).
	options func() *redis.Options
	prefix  string
	advance func(time.Duration) // moves the server's clock forward
	mr      *miniredis.Miniredis
	// pipelined: every store call that may ride a batch rides one
	// (WithAutoPipeline).
	pipelined bool
	// plain: no call rides a batch (WithoutAutoPipeline).
	plain bool
}

func (b *backend) store(opts ...idem.RedisOption) *idem.RedisStore {
	opts = append([]idem.RedisOption{idem.WithPrefix(b.prefix)}, opts...)
	if b.pipelined {
		return idem.PipelineEveryCall(idem.NewRedisStore(b.client, append(opts, idem.WithAutoPipeline())...))
	}
	if b.plain {
		opts = append(opts, idem.WithoutAutoPipeline())
	}
	return idem.NewRedisStore(b.client, opts...)
}

func (b *backend) guard(t *testing.T, opts ...idem.Option) *idem.Guard {
	t.Helper()
	return idem.New(b.store(), append([]idem.Option{quiet}, opts...)...)
}

// quiet discards the engine's log: tests that read it set their own logger.
var quiet = idem.WithLogger(slog.New(slog.DiscardHandler))

// forEachBackend runs f on miniredis with the store's defaults and on a
// real redis-server, there with no call batched and with every call that
// may be batched; the latter skip when redis-server is not installed.
func forEachBackend(t *testing.T, f func(t *testing.T, b *backend)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		m := miniredis.RunT(t)
		options := func() *redis.Options { return &redis.Options{Addr: m.Addr()} }
		c := redis.NewClient(options())
		t.Cleanup(func() { c.Close() })
		f(t, &backend{client: c, options: options, prefix: "idem", advance: m.FastForward, mr: m})
	})
	t.Run("redis-server", func(t *testing.T) {
		srv := redistest.Shared(t)
		f(t, &backend{client: srv.Client(t), options: srv.Options, prefix: redistest.Prefix(t), advance: time.Sleep, plain: true})
	})
	t.Run("redis-server-autopipe", func(t *testing.T) {
		srv := redistest.Shared(t)
		f(t, &backend{client: srv.Client(t), options: srv.Options, prefix: redistest.Prefix(t), advance: time.Sleep, pipelined: true})
	})
}

type payment struct {
	Amount   int    `json:"amount"`
	Currency string `json:"currency"`
}

type receipt struct {
	Charge string `json:"charge"`
	Fence  int64  `json:"fence"`
}

func okFn(v string) func(context.Context, *idem.Attempt) (string, error) {
	return func(context.Context, *idem.Attempt) (string, error) { return v, nil }
}

// recordingLogger returns a logger and a function returning what it wrote.
func recordingLogger() (*slog.Logger, func() string) {
	var mu sync.Mutex
	var buf bytes.Buffer
	h := slog.NewTextHandler(&lockedWriter{mu: &mu, w: &buf}, nil)
	return slog.New(h), func() string {
		mu.Lock()
		defer mu.Unlock()
		return buf.String()
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestDoRunsOnceAndReplays(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t)
		ctx := context.Background()
		var calls atomic.Int32
		var ids []string
		fn := func(ctx context.Context, a *idem.Attempt) (receipt, error) {
			calls.Add(1)
			ids = append(ids, a.ID)
			require.True(t, strings.HasPrefix(a.Key, "pay-"))
			return receipt{Charge: "ch_" + a.ID[:6], Fence: a.Fence}, nil
		}
		first, err := idem.Do(ctx, g, "pay-1", payment{10, "EUR"}, fn)
		require.NoError(t, err)
		require.Equal(t, int64(1), first.Fence)
		again, err := idem.Do(ctx, g, "pay-1", payment{10, "EUR"}, fn)
		require.NoError(t, err)
		require.Equal(t, first, again)
		require.Equal(t, int32(1), calls.Load())
		require.Len(t, ids[0], 22, "128 bits, base64url")

		other, err := idem.Do(ctx, g, "pay-2", payment{10, "EUR"}, fn)
		require.NoError(t, err)
		require.NotEqual(t, first.Charge, other.Charge, "another key is another operation")
		require.Equal(t, int32(2), calls.Load())
	})
}

func TestDoMismatch(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t)
		ctx := context.Background()
		started, finish := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := idem.Do(ctx, g, "k", payment{10, "EUR"}, func(context.Context, *idem.Attempt) (string, error) {
				close(started)
				<-finish
				return "ok", nil
			})
			done <- err
		}()
		<-started
		_, err := idem.Do(ctx, g, "k", payment{99, "EUR"}, okFn("no"))
		require.ErrorIs(t, err, idem.ErrMismatch, "while in progress")
		close(finish)
		require.NoError(t, <-done)
		_, err = idem.Do(ctx, g, "k", payment{99, "EUR"}, okFn("no"))
		require.ErrorIs(t, err, idem.ErrMismatch, "once completed")
	})
}

func TestDoInProgress(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t, idem.WithLease(10*time.Second))
		ctx := context.Background()
		started, finish := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := idem.Do(ctx, g, "k", nil, func(context.Context, *idem.Attempt) (string, error) {
				close(started)
				<-finish
				return "ok", nil
			})
			done <- err
		}()
		<-started
		var calls atomic.Int32
		_, err := idem.Do(ctx, g, "k", nil, func(context.Context, *idem.Attempt) (string, error) {
			calls.Add(1)
			return "", nil
		})
		require.ErrorIs(t, err, idem.ErrInProgress)
		var ip *idem.InProgressError
		require.ErrorAs(t, err, &ip)
		require.Greater(t, ip.RetryAfter, time.Duration(0))
		require.LessOrEqual(t, ip.RetryAfter, 10*time.Second)
		require.Zero(t, calls.Load())
		close(finish)
		require.NoError(t, <-done)
	})
}

// TestDoConcurrentDuplicates fires one key from 64 goroutines: the function
// runs once and every caller gets its result.
func TestDoConcurrentDuplicates(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t, idem.WithWait(10*time.Second))
		ctx := context.Background()
		var calls atomic.Int32
		release := make(chan struct{})
		const n = 64
		results := make(chan string, n)
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				v, err := idem.Do(ctx, g, "double-click", payment{5, "EUR"}, func(ctx context.Context, a *idem.Attempt) (string, error) {
					calls.Add(1)
					<-release
					return fmt.Sprintf("charge-%d", a.Fence), nil
				})
				results <- v
				errs <- err
			})
		}
		close(release)
		wg.Wait()
		close(results)
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		for v := range results {
			require.Equal(t, "charge-1", v)
		}
		require.Equal(t, int32(1), calls.Load(), "one side effect")
	})
}

func TestDoErrorReleases(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t)
		ctx := context.Background()
		boom := errors.New("provider timeout")
		_, err := idem.Do(ctx, g, "k", nil, func(ctx context.Context, a *idem.Attempt) (string, error) {
			require.NoError(t, a.Checkpoint(ctx, "intent", []byte("pi_1")))
			return "", boom
		})
		require.ErrorIs(t, err, boom)
		v, err := idem.Do(ctx, g, "k", nil, func(ctx context.Context, a *idem.Attempt) (string, error) {
			require.Equal(t, int64(2), a.Fence)
			require.Equal(t, "pi_1", string(a.Checkpoints()["intent"]))
			return "second", nil
		})
		require.NoError(t, err)
		require.Equal(t, "second", v)
	})
}

func TestDoPermanentError(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t)
		ctx := context.Background()
		declined := errors.New("card declined")
		var calls atomic.Int32
		fn := func(context.Context, *idem.Attempt) (int, error) {
			calls.Add(1)
			return 0, idem.Permanent(declined)
		}
		_, err := idem.Do(ctx, g, "k", nil, fn)
		require.ErrorIs(t, err, idem.ErrPermanent)
		require.ErrorIs(t, err, declined, "the first caller gets the error itself")
		_, err = idem.Do(ctx, g, "k", nil, fn)
		require.ErrorIs(t, err, idem.ErrPermanent)
		require.EqualError(t, err, "card declined")
		require.Equal(t, int32(1), calls.Load())
		require.Nil(t, idem.Permanent(nil))
	})
}

func TestDoPanicReleases(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t)
		ctx := context.Background()
		func() {
			defer func() { require.Equal(t, "boom", recover()) }()
			idem.Do(ctx, g, "k", nil, func(context.Context, *idem.Attempt) (string, error) { panic("boom") })
		}()
		v, err := idem.Do(ctx, g, "k", nil, func(ctx context.Context, a *idem.Attempt) (string, error) {
			return fmt.Sprint("fence ", a.Fence), nil
		})
		require.NoError(t, err)
		require.Equal(t, "fence 2", v)
	})
}

// TestDoTakeoverAfterCrash: an attempt that claimed and checkpointed, then
// died, blocks the key for its lease; after that the next call takes over
// with Fence 2 and the checkpoint.
func TestDoTakeoverAfterCrash(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		const lease = 300 * time.Millisecond
		g := b.guard(t, idem.WithLease(lease))
		ctx := context.Background()
		// The dead attempt: claimed and checkpointed through the store, no heartbeat.
		started := make(chan *idem.Attempt)
		crash, exited := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(exited)
			idem.Do(ctx, idem.New(&crashingStore{Store: b.store(), crash: crash}, idem.WithLease(lease), quiet), "k", nil,
				func(ctx context.Context, a *idem.Attempt) (string, error) {
					a.Checkpoint(ctx, "charge", []byte("ch_42"))
					close(crash) // from now on the store drops every call: the process is dead
					started <- a
					<-ctx.Done()
					return "", ctx.Err()
				})
		}()
		dead := <-started
		t.Cleanup(func() { <-exited })
		require.Equal(t, int64(1), dead.Fence)
		_, err := idem.Do(ctx, g, "k", nil, okFn("early"))
		require.ErrorIs(t, err, idem.ErrInProgress)

		b.advance(lease + lease/2)
		v, err := idem.Do(ctx, g, "k", nil, func(ctx context.Context, a *idem.Attempt) (string, error) {
			require.Equal(t, int64(2), a.Fence)
			require.Equal(t, dead.ID, a.ID)
			return string(a.Checkpoints()["charge"]), nil
		})
		require.NoError(t, err)
		require.Equal(t, "ch_42", v)
	})
}

// crashingStore fails every call once crash is closed, like a store seen
// from a process that died.
type crashingStore struct {
	idemstore.Store
	crash chan struct{}
}

var errDead = errors.New("process is dead")

func (s *crashingStore) dead() bool {
	select {
	case <-s.crash:
		return true
	default:
		return false
	}
}

func (s *crashingStore) Heartbeat(ctx context.Context, id, owner string, lease time.Duration) error {
	if s.dead() {
		return errDead
	}
	return s.Store.Heartbeat(ctx, id, owner, lease)
}

func (s *crashingStore) Release(ctx context.Context, id, owner string) error {
	if s.dead() {
		return errDead
	}
	return s.Store.Release(ctx, id, owner)
}

func (s *crashingStore) Complete(ctx context.Context, id, owner string, p []byte, r time.Duration) error {
	if s.dead() {
		return errDead
	}
	return s.Store.Complete(ctx, id, owner, p, r)
}

func TestInvalidKeys(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { c.Close() })
	g := idem.New(idem.NewRedisStore(c))
	tests := []struct {
		name string
		key  string
	}{
		{name: "empty", key: ""},
		{name: "too long", key: strings.Repeat("k", 256)},
		{name: "newline", key: "a\nb"},
		{name: "tab", key: "a\tb"},
		{name: "non-ASCII", key: "clé"},
		{name: "DEL", key: "a\x7f"},
		{name: "NUL", key: "a\x00"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ran := false
			_, err := idem.Do(context.Background(), g, tt.key, nil, func(context.Context, *idem.Attempt) (int, error) {
				ran = true
				return 1, nil
			})
			require.ErrorIs(t, err, idem.ErrInvalidKey)
			require.False(t, ran)
			_, err = g.Once(context.Background(), tt.key, func(context.Context) error { ran = true; return nil })
			require.ErrorIs(t, err, idem.ErrInvalidKey)
			require.False(t, ran)
		})
	}
	require.Empty(t, m.Keys(), "invalid keys write nothing")
	t.Run("longest valid", func(t *testing.T) {
		_, err := idem.Do(context.Background(), g, strings.Repeat("k", 255)+"", nil, okFn("ok"))
		require.NoError(t, err)
		_, err = idem.Do(context.Background(), g, " {}:*\"~", nil, okFn("ok"))
		require.NoError(t, err, "printable ASCII, braces and spaces included")
	})
}

func TestBadInput(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { c.Close() })
	g := idem.New(idem.NewRedisStore(c))
	ctx := context.Background()

	_, err := idem.Do(ctx, g, "k", make(chan int), okFn("x"))
	require.ErrorContains(t, err, "not JSON-encodable", "an unencodable request")

	_, err = idem.Do[string](ctx, g, "k", nil, nil)
	require.Error(t, err, "a nil function")
	_, err = g.Once(ctx, "k", nil)
	require.Error(t, err)

	_, err = idem.Do(ctx, idem.New(nil), "k", nil, okFn("x"))
	require.ErrorIs(t, err, idem.ErrStoreUnavailable, "a Guard without a store")
	_, err = idem.Do(ctx, (*idem.Guard)(nil), "k", nil, okFn("x"))
	require.ErrorIs(t, err, idem.ErrStoreUnavailable, "a nil Guard")

	// A result value that turns out not to encode (its type could) is
	// recorded as a permanent error, so the side effect is not repeated.
	var calls int
	fn := func(context.Context, *idem.Attempt) (any, error) { calls++; return func() {}, nil }
	_, err = idem.Do(ctx, g, "unencodable", nil, fn)
	require.ErrorIs(t, err, idem.ErrPermanent)
	_, err = idem.Do(ctx, g, "unencodable", nil, fn)
	require.ErrorContains(t, err, "not JSON-encodable")
	require.Equal(t, 1, calls)

	// A stored value that no longer decodes into T is an error, not a re-run.
	_, err = idem.Do(ctx, g, "typed", nil, okFn("text"))
	require.NoError(t, err)
	_, err = idem.Do(ctx, g, "typed", nil, func(context.Context, *idem.Attempt) (int, error) { return 1, nil })
	require.ErrorContains(t, err, "does not decode")

	_, err = idem.Do(ctx, g, "cp", nil, func(ctx context.Context, a *idem.Attempt) (int, error) {
		return 0, a.Checkpoint(ctx, "", nil)
	})
	require.ErrorContains(t, err, "checkpoint name")
	// A name of 1 to 255 bytes is accepted, a longer one refused.
	_, err = idem.Do(ctx, g, "cp-long", nil, func(ctx context.Context, a *idem.Attempt) (int, error) {
		if err := a.Checkpoint(ctx, strings.Repeat("n", 255), []byte("1")); err != nil {
			return 0, err
		}
		return 0, a.Checkpoint(ctx, strings.Repeat("n", 256), []byte("1"))
	})
	require.ErrorContains(t, err, "checkpoint name must be 1 to 255 bytes, got 256")
}

func TestOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t)
		ctx := context.Background()
		var calls atomic.Int32
		handle := func(context.Context) error { calls.Add(1); return nil }
		ran, err := g.Once(ctx, "msg-1", handle)
		require.NoError(t, err)
		require.True(t, ran)
		ran, err = g.Once(ctx, "msg-1", handle)
		require.NoError(t, err)
		require.False(t, ran, "a redelivery is skipped")
		require.Equal(t, int32(1), calls.Load())

		// An error releases the id: the redelivery runs again.
		boom := errors.New("db down")
		ran, err = g.Once(ctx, "msg-2", func(context.Context) error { return boom })
		require.True(t, ran)
		require.ErrorIs(t, err, boom)
		ran, err = g.Once(ctx, "msg-2", handle)
		require.NoError(t, err)
		require.True(t, ran)

		// A permanent error is recorded: the redelivery gets it, not a re-run.
		ran, err = g.Once(ctx, "msg-3", func(context.Context) error { return idem.Permanent(errors.New("poison")) })
		require.True(t, ran)
		require.ErrorIs(t, err, idem.ErrPermanent)
		ran, err = g.Once(ctx, "msg-3", handle)
		require.False(t, ran)
		require.ErrorIs(t, err, idem.ErrPermanent)
		require.EqualError(t, err, "poison")
		require.Equal(t, int32(2), calls.Load())

		// Once ids and Do keys live apart.
		v, err := idem.Do(ctx, g, "msg-1", nil, okFn("do"))
		require.NoError(t, err)
		require.Equal(t, "do", v)
	})
}

func TestOnceConcurrentRedeliveries(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t, idem.WithWait(10*time.Second))
		ctx := context.Background()
		var calls atomic.Int32
		const n = 32
		ranCount := make(chan bool, n)
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				ran, err := g.Once(ctx, "msg", func(context.Context) error { calls.Add(1); return nil })
				ranCount <- ran
				errs <- err
			})
		}
		wg.Wait()
		close(ranCount)
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		ranN := 0
		for r := range ranCount {
			if r {
				ranN++
			}
		}
		require.Equal(t, 1, ranN)
		require.Equal(t, int32(1), calls.Load())
	})
}

// TestWaitHonoursContext: a waiting duplicate returns when its context ends.
func TestWaitHonoursContext(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t, idem.WithWait(time.Minute))
		started, finish := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := idem.Do(context.Background(), g, "k", nil, func(context.Context, *idem.Attempt) (string, error) {
				close(started)
				<-finish
				return "ok", nil
			})
			done <- err
		}()
		<-started
		ctx, cancel := context.WithCancelCause(context.Background())
		waiting := make(chan error, 1)
		go func() {
			_, err := idem.Do(ctx, g, "k", nil, okFn("dup"))
			waiting <- err
		}()
		gone := errors.New("client went away")
		cancel(gone)
		require.ErrorIs(t, <-waiting, gone)
		close(finish)
		require.NoError(t, <-done)
	})
}

// TestWaiterPollsGently: a waiter polls at most about 20 times a second and
// gets the result once it is stored.
func TestWaiterPollsGently(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		var claims atomic.Int32
		g := idem.New(&countingStore{Store: b.store(), claims: &claims}, idem.WithWait(10*time.Second))
		started, finish := make(chan struct{}), make(chan struct{})
		go func() {
			idem.Do(context.Background(), g, "k", nil, func(context.Context, *idem.Attempt) (string, error) {
				close(started)
				<-finish
				return "first", nil
			})
		}()
		<-started
		claims.Store(0)
		waited := make(chan string, 1)
		begin := time.Now()
		go func() {
			v, _ := idem.Do(context.Background(), g, "k", nil, okFn("dup"))
			waited <- v
		}()
		time.AfterFunc(500*time.Millisecond, func() { close(finish) })
		require.Equal(t, "first", <-waited)
		elapsed := time.Since(begin)
		limit := int32(elapsed.Seconds()*20) + 2
		require.LessOrEqual(t, claims.Load(), limit, "polls in %v", elapsed)
	})
}

type countingStore struct {
	idemstore.Store
	claims *atomic.Int32
}

func (s *countingStore) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	s.claims.Add(1)
	return s.Store.Claim(ctx, id, c)
}

// TestCompleteSurvivesCallerCancel: a caller that gives up just as fn
// finishes does not void the result.
func TestCompleteSurvivesCallerCancel(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t)
		ctx, cancel := context.WithCancel(context.Background())
		v, err := idem.Do(ctx, g, "k", nil, func(context.Context, *idem.Attempt) (string, error) {
			cancel()
			return "charged", nil
		})
		require.NoError(t, err)
		require.Equal(t, "charged", v)
		v, err = idem.Do(context.Background(), g, "k", nil, okFn("again"))
		require.NoError(t, err)
		require.Equal(t, "charged", v)
	})
}

// faultyStore fails the methods named in fail.
type faultyStore struct {
	idemstore.Store
	fail map[string]error
}

func (s *faultyStore) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	if err := s.fail["Claim"]; err != nil {
		return idemstore.ClaimResult{}, err
	}
	return s.Store.Claim(ctx, id, c)
}

func (s *faultyStore) Complete(ctx context.Context, id, owner string, p []byte, r time.Duration) error {
	if err := s.fail["Complete"]; err != nil {
		return err
	}
	return s.Store.Complete(ctx, id, owner, p, r)
}

func (s *faultyStore) Heartbeat(ctx context.Context, id, owner string, lease time.Duration) error {
	if err := s.fail["Heartbeat"]; err != nil {
		return err
	}
	return s.Store.Heartbeat(ctx, id, owner, lease)
}

func TestStoreFaults(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	down := errors.New("connection refused")

	t.Run("claim fails: fn not run", func(t *testing.T) {
		g := idem.New(&faultyStore{Store: idem.NewRedisStore(c), fail: map[string]error{"Claim": down}})
		ran := false
		_, err := idem.Do(ctx, g, "k1", nil, func(context.Context, *idem.Attempt) (int, error) { ran = true; return 1, nil })
		require.ErrorIs(t, err, idem.ErrStoreUnavailable)
		require.ErrorIs(t, err, down)
		require.NotErrorIs(t, err, idem.ErrNotRecorded)
		require.False(t, ran)
	})
	t.Run("complete fails: value with ErrNotRecorded, tried until the lease ends, claim kept", func(t *testing.T) {
		log, logged := recordingLogger()
		g := idem.New(&faultyStore{Store: idem.NewRedisStore(c), fail: map[string]error{"Complete": down}},
			idem.WithLogger(log), idem.WithLease(time.Second))
		v, err := idem.Do(ctx, g, "k2", nil, okFn("charged"))
		require.Equal(t, "charged", v)
		require.ErrorIs(t, err, idem.ErrNotRecorded)
		require.ErrorIs(t, err, idem.ErrStoreUnavailable)
		require.ErrorIs(t, err, down)
		require.Contains(t, logged(), "event=result_pending", "the completion goes on in the background")
		// It is tried until the lease ends, then given up, and logged.
		require.NoError(t, g.Drain(ctx))
		require.Contains(t, logged(), "level=ERROR")
		require.Contains(t, logged(), "event=result_not_recorded")
		// The claim stays until the lease expires, then the retry sees Fence 2.
		g2 := idem.New(idem.NewRedisStore(c), idem.WithLease(time.Second))
		_, err = idem.Do(ctx, g2, "k2", nil, okFn("x"))
		require.ErrorIs(t, err, idem.ErrInProgress)
		m.FastForward(2 * time.Second)
		v, err = idem.Do(ctx, g2, "k2", nil, func(ctx context.Context, a *idem.Attempt) (string, error) {
			return fmt.Sprint(a.Fence), nil
		})
		require.NoError(t, err)
		require.Equal(t, "2", v)
	})
	t.Run("complete finds the key taken: ErrNotRecorded with ErrLeaseLost", func(t *testing.T) {
		g := idem.New(idem.NewRedisStore(c), idem.WithLease(time.Second), quiet)
		v, err := idem.Do(ctx, g, "k3", nil, func(ctx context.Context, a *idem.Attempt) (string, error) {
			m.FastForward(2 * time.Second) // this holder froze; another attempt takes over
			_, err := idem.Do(ctx, g, "k3", nil, okFn("second"))
			require.NoError(t, err)
			return "first", nil
		})
		require.Equal(t, "first", v)
		require.ErrorIs(t, err, idem.ErrNotRecorded)
		require.ErrorIs(t, err, idem.ErrLeaseLost)
		v, err = idem.Do(ctx, g, "k3", nil, okFn("third"))
		require.NoError(t, err)
		require.Equal(t, "second", v, "the stored result is the one that completed")
	})
	t.Run("server gone", func(t *testing.T) {
		m2 := miniredis.RunT(t)
		c2 := redis.NewClient(&redis.Options{Addr: m2.Addr(), MaxRetries: -1})
		t.Cleanup(func() { c2.Close() })
		m2.Close()
		ran := false
		_, err := idem.Do(ctx, idem.New(idem.NewRedisStore(c2)), "k", nil, func(context.Context, *idem.Attempt) (int, error) { ran = true; return 1, nil })
		require.ErrorIs(t, err, idem.ErrStoreUnavailable)
		require.False(t, ran)
	})
}

// TestLeaseLostCancelsFn: when the heartbeat finds the lease taken, fn's
// context ends with cause ErrLeaseLost.
func TestLeaseLostCancelsFn(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t, idem.WithLease(150*time.Millisecond))
		// On a loaded machine a claim may answer too late to trust its
		// short lease: it is refused and fn does not run; try a new key.
		for try := 0; ; try++ {
			require.Less(t, try, 10, "every claim was refused as late")
			ran := false
			_, err := idem.Do(context.Background(), g, fmt.Sprint("k", try), nil, func(ctx context.Context, a *idem.Attempt) (string, error) {
				ran = true
				return leaseLostFn(t, b, ctx, a)
			})
			if !ran && errors.Is(err, idem.ErrStoreUnavailable) {
				continue
			}
			require.ErrorIs(t, err, idem.ErrNotRecorded, "the result is not stored: only the owner may complete")
			require.ErrorIs(t, err, idem.ErrLeaseLost)
			return
		}
	})
}

// leaseLostFn is TestLeaseLostCancelsFn's function: its lease vanishes and
// another attempt takes over; it returns once its context says so.
func leaseLostFn(t *testing.T, b *backend, ctx context.Context, a *idem.Attempt) (string, error) {
	// The lease vanishes (as if it expired) and another attempt takes over.
	_, lease := b.store().Keys(a.ID)
	require.NoError(t, b.client.Del(ctx, lease).Err())
	res, err := b.store().Claim(ctx, a.ID, idemstore.ClaimRequest{Owner: "intruder", Fingerprint: fpOfNil(t, b, a.ID), Lease: time.Minute, TTL: time.Hour})
	require.NoError(t, err)
	require.Equal(t, idemstore.ClaimOK, res.Status)
	require.Equal(t, int64(2), res.Fence)
	<-ctx.Done()
	require.ErrorIs(t, context.Cause(ctx), idem.ErrLeaseLost)
	return "late", nil
}

// TestHeartbeatKeepsLongRuns: a function running several leases keeps the
// key; a duplicate meanwhile is told to wait, not run.
func TestHeartbeatKeepsLongRuns(t *testing.T) {
	srv := redistest.Shared(t)
	b := &backend{client: srv.Client(t), options: srv.Options, prefix: redistest.Prefix(t)}
	g := b.guard(t, idem.WithLease(150*time.Millisecond))
	v, err := idem.Do(context.Background(), g, "k", nil, func(ctx context.Context, a *idem.Attempt) (string, error) {
		for range 4 {
			select {
			case <-ctx.Done():
				return "", context.Cause(ctx)
			case <-time.After(100 * time.Millisecond):
			}
			_, err := idem.Do(context.Background(), g, "k", nil, okFn("dup"))
			require.ErrorIs(t, err, idem.ErrInProgress)
		}
		return "long", nil
	})
	require.NoError(t, err)
	require.Equal(t, "long", v)
}

// TestLeaseOutlivesCallerCancel: when the caller's context ends, fn is told,
// but a function that keeps running keeps its lease: a duplicate meanwhile is
// told to wait, not run.
func TestLeaseOutlivesCallerCancel(t *testing.T) {
	srv := redistest.Shared(t)
	b := &backend{client: srv.Client(t), options: srv.Options, prefix: redistest.Prefix(t)}
	g := b.guard(t, idem.WithLease(150*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	var dupRuns atomic.Int32
	v, err := idem.Do(ctx, g, "k", nil, func(fctx context.Context, a *idem.Attempt) (string, error) {
		cancel()
		<-fctx.Done() // told
		for range 3 { // and keeps going, past two leases
			time.Sleep(100 * time.Millisecond)
			_, err := idem.Do(context.Background(), g, "k", nil, func(context.Context, *idem.Attempt) (string, error) {
				dupRuns.Add(1)
				return "dup", nil
			})
			require.ErrorIs(t, err, idem.ErrInProgress)
		}
		return "finished", nil
	})
	require.NoError(t, err, "the result is stored although the caller left")
	require.Equal(t, "finished", v)
	require.Zero(t, dupRuns.Load())
}

// TestRoundTrips counts commands with a go-redis hook: a fresh Do costs two
// round trips, a replay one, once the scripts are cached on the server.
func TestRoundTrips(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		var n atomic.Int32
		b.client.AddHook(countHook{&n})
		g := b.guard(t)
		ctx := context.Background()
		_, err := idem.Do(ctx, g, "warm-up", nil, okFn("x")) // loads the scripts
		require.NoError(t, err)

		n.Store(0)
		_, err = idem.Do(ctx, g, "fresh", payment{1, "EUR"}, okFn("x"))
		require.NoError(t, err)
		require.Equal(t, int32(2), n.Load(), "fresh Do")

		n.Store(0)
		_, err = idem.Do(ctx, g, "fresh", payment{1, "EUR"}, okFn("x"))
		require.NoError(t, err)
		require.Equal(t, int32(1), n.Load(), "replay")

		n.Store(0)
		_, err = g.Once(ctx, "msg", func(context.Context) error { return nil })
		require.NoError(t, err)
		require.Equal(t, int32(2), n.Load(), "fresh Once")
	})
}

// TestCallerGoneSendsNothing: a Do whose caller's context has already ended
// sends nothing to Redis, neither a claim nor the take-back of one, and
// returns the context's error; the key then runs as if never tried.
func TestCallerGoneSendsNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		var n atomic.Int32
		b.client.AddHook(countHook{&n})
		g := b.guard(t)
		_, err := idem.Do(context.Background(), g, "warm-up", nil, okFn("x")) // loads the scripts
		require.NoError(t, err)

		n.Store(0)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err = idem.Do(ctx, g, "k", nil, okFn("x"))
		require.ErrorIs(t, err, context.Canceled)
		dctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		require.NoError(t, g.Drain(dctx))
		require.Zero(t, n.Load(), "commands sent")

		a, err := idem.Do(context.Background(), g, "k", nil, func(_ context.Context, a *idem.Attempt) (int64, error) { return a.Fence, nil })
		require.NoError(t, err)
		require.Equal(t, int64(1), a, "the first attempt that ran")
	})
}

type countHook struct{ n *atomic.Int32 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		// A NOSCRIPT fallback re-enters the hook; count what reached the server.
		h.n.Add(1)
		return err
	}
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// TestTTLInvariant exercises every state and checks that every key has a
// TTL no longer than lease + retention.
func TestTTLInvariant(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		const lease, retention = time.Second, time.Hour
		g := b.guard(t, idem.WithLease(lease), idem.WithRetention(retention))
		ctx := context.Background()
		idem.Do(ctx, g, "completed", nil, okFn("x"))
		idem.Do(ctx, g, "released", nil, func(context.Context, *idem.Attempt) (string, error) { return "", errors.New("no") })
		idem.Do(ctx, g, "permanent", nil, func(context.Context, *idem.Attempt) (string, error) {
			return "", idem.Permanent(errors.New("no"))
		})
		g.Once(ctx, "message", func(context.Context) error { return nil })
		func() {
			defer func() { recover() }()
			idem.Do(ctx, g, "panicked", nil, func(context.Context, *idem.Attempt) (string, error) { panic("x") })
		}()
		started, finish := make(chan struct{}), make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			idem.Do(ctx, g, "in-progress", nil, func(ctx context.Context, a *idem.Attempt) (string, error) {
				a.Checkpoint(ctx, "c", []byte("v"))
				close(started)
				<-finish
				return "", nil
			})
		}()
		<-started
		keys, err := b.client.Keys(ctx, b.prefix+":*").Result()
		require.NoError(t, err)
		require.GreaterOrEqual(t, len(keys), 7, "6 records and the live lease: %v", keys)
		for _, k := range keys {
			ttl, err := b.client.PTTL(ctx, k).Result()
			require.NoError(t, err)
			require.Greater(t, ttl, time.Duration(0), "key %s has no TTL", k)
			require.LessOrEqual(t, ttl, lease+retention, "key %s", k)
		}
		close(finish)
		<-done
	})
}

// TestNoGoroutineOutlivesDo: the heartbeat and the goroutine bounding a
// completion are gone once Do returns: no goroutine runs library code
// afterwards, and on a store that answers nothing goes on in the
// background. (Counting goroutines would count the connections the client
// pool opens as well.)
func TestNoGoroutineOutlivesDo(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { c.Close() })
	g := idem.New(idem.NewRedisStore(c), idem.WithLease(60*time.Millisecond))
	ctx := context.Background()
	for i := range 20 {
		idem.Do(ctx, g, fmt.Sprint("k", i), nil, func(context.Context, *idem.Attempt) (string, error) {
			time.Sleep(30 * time.Millisecond) // long enough for a heartbeat
			return "x", nil
		})
	}
	inLibrary := func() string {
		buf := make([]byte, 1<<20)
		var out string
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			// Writes going on in the background belong to other tests'
			// Guards: this one's have none (Drain, below).
			if strings.Contains(g, "github.com/idemkit/idem.(*Guard)") && !strings.Contains(g, "(*Guard).retry(") {
				out += g + "\n\n"
			}
		}
		return out
	}
	// A goroutine that has sent its result may still be exiting, and no
	// event marks its exit: poll the stacks, with a deadline far beyond the
	// microseconds that takes.
	left := inLibrary()
	for deadline := time.Now().Add(10 * time.Second); left != "" && time.Now().Before(deadline); left = inLibrary() {
		time.Sleep(time.Millisecond)
	}
	require.Empty(t, left, "goroutines still in the library")
	done, cancel := context.WithCancel(ctx)
	cancel()
	require.NoError(t, g.Drain(done), "no write of this Guard goes on in the background")
}

// fpOfNil reads the fingerprint of the record of id, for a test that claims
// it directly through the store.
func fpOfNil(t *testing.T, b *backend, id string) string {
	t.Helper()
	r, err := b.store().Read(context.Background(), id)
	require.NoError(t, err)
	require.NotNil(t, r)
	return r.Fingerprint
}

func TestMain(m *testing.M) {
	log := &redisLog{out: stdlog.New(os.Stderr, "redis: ", stdlog.LstdFlags)}
	redis.SetLogger(log)
	watchdog()
	code := m.Run()
	redistest.StopShared()
	if n := log.maint.Load(); n > 0 && code == 0 {
		fmt.Fprintf(os.Stderr, "FAIL: go-redis could not set up maintenance notifications for %d client(s): "+
			"a client built from another client's Options() shares its push notification processor\n", n)
		code = 1
	}
	os.Exit(code)
}

// watchdog fails the run, with every goroutine's stack, once it has taken
// longer than IDEM_TEST_DEADLINE (a duration; unset: no bound but go test's
// -timeout). It is go test's -timeout under a name of its own: a mutation
// run sets -timeout itself, to tell a slow test from a stuck one, and counts
// a mutant that makes a test wait without end as timed out rather than
// caught; scripts/mutation sets IDEM_TEST_DEADLINE well above the tests'
// normal time, so that such a mutant fails the run like any other.
func watchdog() {
	d, err := time.ParseDuration(os.Getenv("IDEM_TEST_DEADLINE"))
	if err != nil || d <= 0 {
		return
	}
	time.AfterFunc(d, func() {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		fmt.Fprintf(os.Stderr, "FAIL: the tests ran past IDEM_TEST_DEADLINE=%s: a wait without end\n%s", d, buf)
		redistest.StopShared()
		os.Exit(1)
	})
}

// redisLog is go-redis's logger in the tests: it writes as go-redis's own
// does, and counts the clients whose maintenance notifications could not be
// set up, which only a test's mistake causes (see backend.options).
type redisLog struct {
	out   *stdlog.Logger
	maint atomic.Int32
}

func (l *redisLog) Printf(_ context.Context, format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if strings.Contains(msg, "failed to initialize maintnotifications") {
		l.maint.Add(1)
	}
	l.out.Print(msg)
}
