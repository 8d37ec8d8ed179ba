package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/redistest"
)

// forEachAdminBackend runs f on miniredis, a real redis-server and a real
// Redis Cluster, each with a prefix of the test's own.
func forEachAdminBackend(t *testing.T, f func(t *testing.T, c redis.UniversalClient, prefix string)) {
	t.Run("miniredis", func(t *testing.T) {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		f(t, c, "idem")
	})
	t.Run("redis-server", func(t *testing.T) {
		f(t, redistest.Shared(t).Client(t), redistest.Prefix(t))
	})
	t.Run("cluster", func(t *testing.T) {
		f(t, redistest.SharedCluster(t).Client(t), redistest.Prefix(t))
	})
}

// holdAttempt starts idem.Do of key in the background, with a checkpoint
// saved, and returns once its function runs. finish lets the function
// return err and returns Do's error.
func holdAttempt(t *testing.T, g *idem.Guard, key string, err error) (finish func() error) {
	t.Helper()
	running, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		_, derr := idem.Do(context.Background(), g, key, "req", func(ctx context.Context, a *idem.Attempt) (string, error) {
			if err := a.Checkpoint(ctx, "charge_id", []byte("ch_1")); err != nil {
				return "", err
			}
			close(running)
			<-release
			return "", err
		})
		done <- derr
	}()
	select {
	case <-running:
	case derr := <-done:
		t.Fatalf("Do returned before its function ran: %v", derr)
	}
	return func() error {
		close(release)
		return <-done
	}
}

func TestOperationID(t *testing.T) {
	ctx := context.Background()
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	s := idem.NewRedisStore(c)
	g := idem.New(s)

	id, err := idem.Do(ctx, g, "order-42", "req", func(ctx context.Context, a *idem.Attempt) (string, error) { return a.ID, nil })
	require.NoError(t, err)
	require.Equal(t, id, idem.OperationID(idem.KindDo, "", "order-42"), "Do: the id of Attempt.ID")

	_, err = g.Once(ctx, "msg-1", func(ctx context.Context) error { return nil })
	require.NoError(t, err)
	rec, _ := s.Keys(idem.OperationID(idem.KindOnce, "", "msg-1"))
	require.True(t, m.Exists(rec), "Once: its record is under the id")

	var seen []string
	h := g.Middleware(idem.WithScope(func(r *http.Request) string { return "tenant-1" }))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, ok := idem.AttemptFrom(r.Context())
		require.True(t, ok)
		seen = append(seen, a.ID)
	}))
	for _, header := range []string{`abc`, `"k\"2"`} {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Header.Set("Idempotency-Key", header)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	require.Equal(t, []string{idem.OperationID(idem.KindHTTP, "tenant-1", "abc"), idem.OperationID(idem.KindHTTP, "tenant-1", `k"2`)}, seen,
		"HTTP: the scope, and the key without RFC 8941 quotes")

	kinds := map[string]bool{}
	for _, k := range []idem.Kind{idem.KindDo, idem.KindOnce, idem.KindHTTP} {
		kinds[idem.OperationID(k, "", "same")] = true
	}
	require.Len(t, kinds, 3, "each kind has a key space of its own")
	require.NotEqual(t, idem.OperationID(idem.KindHTTP, "a", "bc"), idem.OperationID(idem.KindHTTP, "ab", "c"))
	require.Empty(t, idem.OperationID(idem.Kind(9), "", "k"))
	require.Empty(t, idem.OperationID(idem.Kind(0), "", "k"), "the zero Kind is no kind")
	require.Equal(t, "do once http Kind(9) Kind(0)", fmt.Sprint(idem.KindDo, idem.KindOnce, idem.KindHTTP, idem.Kind(9), idem.Kind(0)))
}

func TestInspect(t *testing.T) {
	forEachAdminBackend(t, func(t *testing.T, c redis.UniversalClient, prefix string) {
		ctx := context.Background()
		s := idem.NewRedisStore(c, idem.WithPrefix(prefix))
		g := idem.New(s, idem.WithLease(time.Minute))
		id := idem.OperationID(idem.KindDo, "", "k1")

		in, err := s.Inspect(ctx, id)
		require.NoError(t, err)
		rec, lease := s.Keys(id)
		require.Equal(t, &idem.Inspection{ID: id, RecordKey: rec, LeaseKey: lease}, in, "absent")
		require.False(t, in.Held())

		// In progress, held by a running attempt.
		before := time.Now().Truncate(time.Second)
		finish := holdAttempt(t, g, "k1", errors.New("provider down"))
		in, err = s.Inspect(ctx, id)
		require.NoError(t, err)
		r := in.Record
		require.True(t, in.Held())
		require.Equal(t, r.Owner, in.LeaseHolder)
		require.Equal(t, idemstore.StateInProgress, r.State)
		require.Equal(t, int64(1), r.Fence)
		require.Equal(t, map[string][]byte{"charge_id": []byte("ch_1")}, r.Checkpoints)
		require.WithinRange(t, r.Created, before, time.Now())
		require.InDelta(t, time.Minute, r.LeaseTTL, float64(5*time.Second))
		require.InDelta(t, time.Minute+24*time.Hour, r.TTL, float64(5*time.Second))
		require.Nil(t, in.Result)

		// Released: in progress, not held.
		require.EqualError(t, finish(), "provider down")
		in, err = s.Inspect(ctx, id)
		require.NoError(t, err)
		require.False(t, in.Held())
		require.Empty(t, in.LeaseHolder)
		require.Equal(t, idemstore.StateInProgress, in.Record.State)
		require.Zero(t, in.Record.LeaseTTL)

		// Completed, by the next attempt.
		_, err = idem.Do(ctx, g, "k1", "req", func(ctx context.Context, a *idem.Attempt) (map[string]int, error) {
			return map[string]int{"fence": int(a.Fence)}, nil
		})
		require.NoError(t, err)
		in, err = s.Inspect(ctx, id)
		require.NoError(t, err)
		require.Equal(t, idemstore.StateCompleted, in.Record.State)
		require.Equal(t, int64(2), in.Record.Fence)
		require.Equal(t, r.Created, in.Record.Created, "the creation time of the first claim")
		require.Equal(t, &idem.StoredResult{Type: "json", Size: len(`{"fence":2}`)}, in.Result)
		require.InDelta(t, 24*time.Hour, in.Record.TTL, float64(5*time.Second))
	})
}

func TestInspectResults(t *testing.T) {
	ctx := context.Background()
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	s := idem.NewRedisStore(c, idem.WithCompression(16))
	g := idem.New(s)
	inspect := func(kind idem.Kind, scope, key string) *idem.StoredResult {
		t.Helper()
		in, err := s.Inspect(ctx, idem.OperationID(kind, scope, key))
		require.NoError(t, err)
		return in.Result
	}

	_, _ = idem.Do(ctx, g, "bytes", "req", func(context.Context, *idem.Attempt) ([]byte, error) { return []byte("abc"), nil })
	require.Equal(t, &idem.StoredResult{Type: "bytes", Size: 3}, inspect(idem.KindDo, "", "bytes"))
	long := strings.Repeat("compressible ", 100)
	_, _ = idem.Do(ctx, g, "string", "req", func(context.Context, *idem.Attempt) (string, error) { return long, nil })
	require.Equal(t, &idem.StoredResult{Type: "string", Size: len(long)}, inspect(idem.KindDo, "", "string"), "sizes are before compression")
	_, _ = idem.Do(ctx, g, "error", "req", func(context.Context, *idem.Attempt) (int, error) {
		return 0, idem.Permanent(errors.New("card declined"))
	})
	require.Equal(t, &idem.StoredResult{Type: "error", Size: 13, Error: "card declined"}, inspect(idem.KindDo, "", "error"))
	_, _ = g.Once(ctx, "msg", func(context.Context) error { return nil })
	require.Equal(t, &idem.StoredResult{Type: "json"}, inspect(idem.KindOnce, "", "msg"))

	h := g.Middleware(idem.WithScope(func(*http.Request) string { return "t1" }), idem.WithMaxResponseBody(100))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/payments/42")
		w.Header().Set("Set-Cookie", "never=stored")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(strings.Repeat("x", len(r.Header.Get("Idempotency-Key"))*10)))
	}))
	for _, key := range []string{"small", "too-large-to-store"} {
		r := httptest.NewRequest(http.MethodPost, "/payments", nil)
		r.Header.Set("Idempotency-Key", key)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	require.Equal(t, &idem.StoredResult{Type: "response", Status: 201, Size: 50,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/42"}}}, inspect(idem.KindHTTP, "t1", "small"))
	require.Equal(t, &idem.StoredResult{Type: "response-not-stored", Status: 201,
		Header: http.Header{"Location": {"/payments/42"}}}, inspect(idem.KindHTTP, "t1", "too-large-to-store"))

	// A key under the prefix that is no idem record is an error, not a guess.
	rec, _ := s.Keys(idem.OperationID(idem.KindDo, "", "foreign"))
	require.NoError(t, c.Set(ctx, rec, "not a record", 0).Err())
	_, err := s.Inspect(ctx, idem.OperationID(idem.KindDo, "", "foreign"))
	require.ErrorContains(t, err, "unreadable record")
	require.ErrorContains(t, err, rec)
}

func TestInspectUnusableStore(t *testing.T) {
	_, err := idem.NewRedisStore(nil).Inspect(context.Background(), "id")
	require.ErrorIs(t, err, idem.ErrStoreUnavailable)
	_, err = idem.NewRedisStore(nil).Forget(context.Background(), "id", true)
	require.ErrorIs(t, err, idem.ErrStoreUnavailable)
	var s *idem.RedisStore
	_, err = s.Inspect(context.Background(), "id")
	require.ErrorIs(t, err, idem.ErrStoreUnavailable)
}

func TestForget(t *testing.T) {
	forEachAdminBackend(t, func(t *testing.T, c redis.UniversalClient, prefix string) {
		ctx := context.Background()
		s := idem.NewRedisStore(c, idem.WithPrefix(prefix))
		g := idem.New(s, idem.WithLease(time.Minute))
		id := idem.OperationID(idem.KindDo, "", "k1")
		rec, lease := s.Keys(id)
		exists := func() int64 { return c.Exists(ctx, rec).Val() + c.Exists(ctx, lease).Val() }
		runs := 0
		fn := func(ctx context.Context, a *idem.Attempt) (int64, error) { runs++; return a.Fence, nil }

		deleted, err := s.Forget(ctx, id, false)
		require.NoError(t, err)
		require.False(t, deleted, "nothing to forget")

		// A completed result, forgotten: the key runs again as new.
		_, err = idem.Do(ctx, g, "k1", "req", fn)
		require.NoError(t, err)
		deleted, err = s.Forget(ctx, id, false)
		require.NoError(t, err)
		require.True(t, deleted)
		require.Zero(t, exists())
		fence, err := idem.Do(ctx, g, "k1", "req", fn)
		require.NoError(t, err)
		require.Equal(t, int64(1), fence)
		require.Equal(t, 2, runs)

	})
}

func TestForgetLiveLease(t *testing.T) {
	forEachAdminBackend(t, func(t *testing.T, c redis.UniversalClient, prefix string) {
		ctx := context.Background()
		s := idem.NewRedisStore(c, idem.WithPrefix(prefix))
		finish := holdAttempt(t, idem.New(s, idem.WithLease(time.Minute)), "k2", nil)
		id2 := idem.OperationID(idem.KindDo, "", "k2")
		deleted, err := s.Forget(ctx, id2, false)
		var busy *idem.InProgressError
		require.ErrorAs(t, err, &busy)
		require.InDelta(t, time.Minute, busy.RetryAfter, float64(5*time.Second))
		require.False(t, deleted)
		in, err := s.Inspect(ctx, id2)
		require.NoError(t, err)
		require.True(t, in.Held(), "a refused forget changes nothing")

		deleted, err = s.Forget(ctx, id2, true)
		require.NoError(t, err)
		require.True(t, deleted)
		in, err = s.Inspect(ctx, id2)
		require.NoError(t, err)
		require.Nil(t, in.Record)
		require.False(t, in.Held())
		require.ErrorIs(t, finish(), idem.ErrNotRecorded, "the forced-out holder's result is not stored")
		in, err = s.Inspect(ctx, id2)
		require.NoError(t, err)
		require.Nil(t, in.Record, "and it does not come back")
	})
}

func TestForgetWaitsForReplicas(t *testing.T) {
	ctx := context.Background()
	c := redistest.Shared(t).Client(t)
	prefix := redistest.Prefix(t)
	s := idem.NewRedisStore(c, idem.WithPrefix(prefix))
	_, err := idem.Do(ctx, idem.New(s), "k", "req", func(context.Context, *idem.Attempt) (int, error) { return 1, nil })
	require.NoError(t, err)
	acked := idem.NewRedisStore(c, idem.WithPrefix(prefix), idem.WithReplicaAck(1, 50*time.Millisecond))
	deleted, err := acked.Forget(ctx, idem.OperationID(idem.KindDo, "", "k"), false)
	require.True(t, deleted, "deleted on the primary")
	require.ErrorContains(t, err, "0 of 1 replicas acknowledged", "a server without replicas cannot acknowledge")
}

// TestAdminMemoryPerRecord bounds what idem stores for a completed record
// with a 200 B body: one string whose length is the body's plus at most
// 64 B of fields (a format that grew by 32 B fails), and no other key once
// completed. The bound is on bytes written (STRLEN), not on what Redis's
// allocator rounds them to: MEMORY USAGE, key name and Redis overhead
// included, differs between jemalloc and glibc malloc, so it is logged, with
// a plain SET of the body under a key of the same length and the record
// without format 1's version marker and creation time, for the docs.
func TestAdminMemoryPerRecord(t *testing.T) {
	ctx := context.Background()
	c := redistest.Shared(t).Client(t)
	prefix := "m" + redistest.Prefix(t)[:3] // as long as "idem"
	s := idem.NewRedisStore(c, idem.WithPrefix(prefix))
	g := idem.New(s)
	body := []byte(strings.Repeat("0123456789abcdefghij", 10))
	const n = 50
	var record, plain, older, stored int64
	for i := range n {
		key := fmt.Sprintf("order-%d", i)
		_, err := idem.Do(ctx, g, key, "req", func(context.Context, *idem.Attempt) ([]byte, error) { return body, nil })
		require.NoError(t, err)
		rec, lease := s.Keys(idem.OperationID(idem.KindDo, "", key))
		record += c.MemoryUsage(ctx, rec, 0).Val()
		require.Equal(t, "string", c.Type(ctx, rec).Val(), "one string per record")
		require.Zero(t, c.Exists(ctx, lease).Val(), "no lease left once completed")
		stored += c.StrLen(ctx, rec).Val()

		// The same record before format 1: "C|FENCE|OWNER|FP|BODY".
		v := c.Get(ctx, rec).Val()
		f := strings.SplitN(v, "|", 6)
		ttl := c.PTTL(ctx, rec).Val()
		oldKey := "o" + rec[1:]
		require.NoError(t, c.Set(ctx, oldKey, "C|"+strings.Join(f[1:4], "|")+"|"+f[5], ttl).Err())
		older += c.MemoryUsage(ctx, oldKey, 0).Val()

		plainKey := "p" + rec[1:]
		require.NoError(t, c.Set(ctx, plainKey, body, ttl).Err())
		plain += c.MemoryUsage(ctx, plainKey, 0).Val()
		require.NoError(t, c.Del(ctx, oldKey, plainKey).Err())
	}
	over := func(total int64) int64 { return total/n - int64(len(body)) }
	t.Logf("memory per completed record, 200 B body: idem body + %d B (before format 1: body + %d B), plain SET body + %d B; stored value body + %d B",
		over(record), over(older), over(plain), over(stored))
	require.LessOrEqual(t, over(stored), int64(64), "the stored value is the body plus at most 64 B")
}

// TestAdminFullRedisFailsClosed: a Redis at its maxmemory under noeviction
// refuses writes, scripts' writes included. idem then fails closed: a new
// key's function does not run (ErrStoreUnavailable, HTTP 503). Replays,
// which write nothing, are still served.
func TestAdminFullRedisFailsClosed(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t, redistest.WithArgs("--maxmemory", "4mb", "--maxmemory-policy", "noeviction"))
	c := srv.Client(t)
	g := idem.New(idem.NewRedisStore(c))
	_, err := idem.Do(ctx, g, "before", "req", func(context.Context, *idem.Attempt) (int, error) { return 1, nil })
	require.NoError(t, err)
	// Fill with ever smaller values: a value's own bytes count while the
	// command is read, so a large one is refused before memory is full.
	i := 0
	for _, size := range []int{64 << 10, 4 << 10, 256, 16, 1} {
		for ; ; i++ {
			if err := c.Set(ctx, fmt.Sprintf("fill:%d", i), strings.Repeat("x", size), 0).Err(); err != nil {
				require.ErrorContains(t, err, "OOM")
				break
			}
		}
	}
	ran := false
	_, err = idem.Do(ctx, g, "after", "req", func(context.Context, *idem.Attempt) (int, error) { ran = true; return 1, nil })
	require.ErrorIs(t, err, idem.ErrStoreUnavailable)
	require.False(t, ran)
	v, err := idem.Do(ctx, g, "before", "req", func(context.Context, *idem.Attempt) (int, error) { ran = true; return 2, nil })
	require.NoError(t, err)
	require.Equal(t, 1, v, "replayed")
	require.False(t, ran)
}
