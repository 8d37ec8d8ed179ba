package redistest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestMain stops the shared server and cluster when the tests are done, as
// the package documentation recommends.
func TestMain(m *testing.M) {
	code := m.Run()
	StopShared()
	os.Exit(code)
}

func TestFrameReply(t *testing.T) {
	tests := []struct {
		name string
		in   string
		n    int // 0: incomplete
	}{
		{name: "simple", in: "+OK\r\n", n: 5},
		{name: "simple with tail", in: "+OK\r\n:1\r\n", n: 5},
		{name: "error", in: "-ERR x\r\n", n: 8},
		{name: "integer", in: ":42\r\n", n: 5},
		{name: "bulk", in: "$3\r\nfoo\r\n", n: 9},
		{name: "bulk with CRLF inside", in: "$4\r\na\r\nb\r\n", n: 10},
		{name: "null bulk", in: "$-1\r\n", n: 5},
		{name: "null resp3", in: "_\r\n", n: 3},
		{name: "array", in: "*2\r\n$1\r\na\r\n:1\r\n", n: 15},
		{name: "empty array", in: "*0\r\n", n: 4},
		{name: "nested", in: "*1\r\n*1\r\n+x\r\n", n: 12},
		{name: "map", in: "%1\r\n+k\r\n:1\r\n", n: 12},
		{name: "set", in: "~1\r\n+a\r\n", n: 8},
		{name: "verbatim", in: "=7\r\ntxt:abc\r\n", n: 13},
		{name: "blob error", in: "!3\r\nERR\r\n", n: 9},
		{name: "attribute then reply", in: "|1\r\n+a\r\n+b\r\n:5\r\n", n: 16},
		{name: "push", in: ">1\r\n+m\r\n", n: 8},
		{name: "incomplete line", in: "+OK\r", n: 0},
		{name: "incomplete bulk", in: "$3\r\nfo", n: 0},
		{name: "incomplete array", in: "*2\r\n:1\r\n", n: 0},
		{name: "empty", in: "", n: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, ok, err := frameReply([]byte(tt.in))
			require.NoError(t, err)
			require.Equal(t, tt.n != 0, ok)
			require.Equal(t, tt.n, n)
		})
	}
	_, _, err := frameReply([]byte("?x\r\n"))
	require.ErrorIs(t, err, errMalformed)
}

func TestParseCommand(t *testing.T) {
	raw := appendCommand(nil, "EVALSHA", "abc", "1", "k{x}", "")
	args, n, ok, err := parseCommand(raw)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, len(raw), n)
	require.Equal(t, []string{"EVALSHA", "abc", "1", "k{x}", ""}, args)

	for i := range len(raw) - 1 {
		_, _, ok, err := parseCommand(raw[:i])
		require.NoError(t, err)
		require.False(t, ok, "prefix of %d bytes", i)
	}
	_, _, _, err = parseCommand([]byte("PING\r\n"))
	require.ErrorIs(t, err, errMalformed)
}

func TestMatchers(t *testing.T) {
	const src = "return 1"
	sha := "e0e1f9fabfc9d4800c877a703b823ac0578ff8db" // SHA-1 of src
	require.True(t, MatchScript(src)([]string{"evalsha", sha, "0"}))
	require.True(t, MatchScript(src)([]string{"EVAL", src, "0"}))
	require.False(t, MatchScript(src)([]string{"EVAL", "return 2", "0"}))
	require.False(t, MatchScript(src)([]string{"GET", src}))
	require.True(t, MatchCommand("incr")([]string{"INCR", "k"}))
	require.False(t, MatchCommand("incr")([]string{"INCRBY", "k", "1"}))
	require.True(t, MatchSubstring("ab")([]string{"SET", "xaby", "1"}))
	require.False(t, MatchSubstring("ab")(nil))
}

func TestServerStopRestartKill(t *testing.T) {
	ctx := context.Background()
	s := Start(t)
	opts := s.Options()
	opts.MaxRetries = -1
	opts.DialerRetries = 1
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })

	require.NoError(t, c.Set(ctx, "k", "v", time.Hour).Err())
	s.Stop(t)
	require.False(t, s.Running())
	require.Error(t, c.Ping(ctx).Err())

	s.Restart(t)
	require.True(t, s.Running())
	require.Equal(t, "v", c.Get(ctx, "k").Val(), "Stop saves the data for Restart")
	require.Greater(t, c.PTTL(ctx, "k").Val(), 59*time.Minute, "TTLs survive Stop/Restart")

	s.Kill(t)
	require.Error(t, c.Ping(ctx).Err())
	s.Restart(t)
	require.ErrorIs(t, c.Get(ctx, "k").Err(), redis.Nil, "Kill loses the data")
}

// TestLaunchOnTakenPort: a server whose port another process holds is not
// taken for started because that other process answers PING. (Packages run
// in parallel, and the port chosen can be taken before redis-server binds it.)
func TestLaunchOnTakenPort(t *testing.T) {
	other := Start(t)
	path := lookPath(t, "redis-server", skipServer)
	for range 5 {
		s := &Server{path: path, dir: t.TempDir(), port: other.Port()}
		err := s.launch()
		if err == nil {
			s.stopNow()
		}
		require.ErrorIs(t, err, errAddrInUse)
	}
}

func TestServerPause(t *testing.T) {
	ctx := context.Background()
	s := Start(t)
	opts := s.Options()
	opts.ReadTimeout = 100 * time.Millisecond
	opts.MaxRetries = -1
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.Ping(ctx).Err())

	s.Pause(t)
	err := c.Ping(ctx).Err()
	s.Resume(t)
	var netErr interface{ Timeout() bool }
	require.ErrorAs(t, err, &netErr)
	require.True(t, netErr.Timeout())
	require.NoError(t, c.Ping(ctx).Err())
}

func TestStartWithArgs(t *testing.T) {
	s := Start(t, WithArgs("--maxmemory", "12345678"))
	v, err := s.Client(t).ConfigGet(context.Background(), "maxmemory").Result()
	require.NoError(t, err)
	require.Equal(t, "12345678", v["maxmemory"])
}

func TestWithoutCommands(t *testing.T) {
	c := Start(t, WithoutCommands("CONFIG", "FLUSHDB")).Client(t)
	ctx := context.Background()
	require.ErrorContains(t, c.ConfigGet(ctx, "save").Err(), "unknown command")
	require.ErrorContains(t, c.FlushDB(ctx).Err(), "unknown command")
	require.NoError(t, c.Ping(ctx).Err())
}

func TestShared(t *testing.T) {
	s := Shared(t)
	require.Same(t, s, Shared(t))
	require.NoError(t, s.Client(t).Ping(context.Background()).Err())
	require.NotEqual(t, Prefix(t), Prefix(t))
}

// TestReplyDropperIncr shows the hazard the dropper exists for: the server
// executes INCR, the reply is lost, go-redis re-sends, INCR runs twice.
func TestReplyDropperIncr(t *testing.T) {
	ctx := context.Background()
	s := Shared(t)
	key := Prefix(t) + ":n"

	d := NewReplyDropper(MatchCommand("INCR"), 1)
	opts := s.Options()
	opts.Dialer = d.Dial
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })

	got, err := c.Incr(ctx, key).Result()
	require.NoError(t, err)
	require.Equal(t, int64(2), got, "the retried INCR ran a second time")
	require.Equal(t, 1, d.Dropped())

	got, err = c.Incr(ctx, key).Result()
	require.NoError(t, err)
	require.Equal(t, int64(3), got, "only one reply is dropped")
	require.Equal(t, 1, d.Dropped())

	// Without retries the caller sees the lost reply as io.EOF, though the
	// command ran.
	d.Arm(1)
	opts = s.Options()
	opts.Dialer = d.Dial
	opts.MaxRetries = -1
	c2 := redis.NewClient(opts)
	t.Cleanup(func() { _ = c2.Close() })
	require.ErrorIs(t, c2.Incr(ctx, key).Err(), io.EOF)
	require.Equal(t, "4", s.Client(t).Get(ctx, key).Val())
}

// TestReplyDropperScript drops the reply of a Lua script run with
// redis.Script: the NOSCRIPT error of the first EVALSHA passes (nothing ran),
// the EVAL that follows runs and loses its reply, and the retry runs it again.
func TestReplyDropperScript(t *testing.T) {
	ctx := context.Background()
	s := Start(t) // a fresh script cache
	const src = "return redis.call('INCR', KEYS[1])"
	script := redis.NewScript(src)

	d := NewReplyDropper(MatchScript(src), 1)
	opts := s.Options()
	opts.Dialer = d.Dial
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })

	got, err := script.Run(ctx, c, []string{"n"}).Int64()
	require.NoError(t, err)
	require.Equal(t, int64(2), got)
	require.Equal(t, 1, d.Dropped())

	d.Arm(1) // now cached: the EVALSHA reply is dropped
	got, err = script.Run(ctx, c, []string{"n"}).Int64()
	require.NoError(t, err)
	require.Equal(t, int64(4), got)
	require.Equal(t, 2, d.Dropped())
}

// TestReplyDropperConcurrent runs many clients' commands through one
// dropper: exactly the armed number of replies is dropped, and every other
// command gets its own reply.
func TestReplyDropperConcurrent(t *testing.T) {
	ctx := context.Background()
	s := Shared(t)
	prefix := Prefix(t)
	d := NewReplyDropper(MatchCommand("INCR"), 3)
	opts := s.Options()
	opts.Dialer = d.Dial
	opts.PoolSize = 8
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })

	const workers = 16
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			key := fmt.Sprintf("%s:w%d", prefix, w)
			for i := range 20 {
				if err := c.Set(ctx, key+":s", i, time.Minute).Err(); err != nil {
					errs <- err
					return
				}
				if err := c.Incr(ctx, key).Err(); err != nil {
					errs <- err
					return
				}
				if v, err := c.Get(ctx, key+":s").Result(); err != nil || v != strconv.Itoa(i) {
					errs <- fmt.Errorf("GET = %q, %v; want %d", v, err, i)
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		require.NoError(t, <-errs)
	}
	require.Equal(t, 3, d.Dropped())
	var total int64
	for w := range workers {
		n, err := c.Get(ctx, fmt.Sprintf("%s:w%d", prefix, w)).Int64()
		require.NoError(t, err)
		total += n
	}
	require.Equal(t, int64(workers*20+3), total, "each dropped INCR ran twice")
}

func TestCluster(t *testing.T) {
	t.Parallel()
	start := time.Now()
	cl := SharedCluster(t)
	t.Logf("cluster ready in %v", time.Since(start))
	require.Len(t, cl.Addrs(), 3)
	ctx := context.Background()
	c := cl.Client(t)

	var mu sync.Mutex
	masters := map[string]bool{}
	require.NoError(t, c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		masters[m.Options().Addr] = true
		return nil
	}))
	require.Len(t, masters, 3)

	prefix := Prefix(t)
	slots := map[int]bool{}
	for i := range 64 {
		key := fmt.Sprintf("%s:{%d}", prefix, i)
		require.NoError(t, c.Set(ctx, key, i, time.Minute).Err())
		require.Equal(t, strconv.Itoa(i), c.Get(ctx, key).Val())
		slot := cl.KeySlot(t, key)
		require.Equal(t, cl.KeySlot(t, fmt.Sprintf("other{%d}:x", i)), slot, "hash tags decide the slot")
		slots[slot] = true
	}
	require.Greater(t, len(slots), 32)

	d := NewReplyDropper(MatchCommand("INCR"), 1)
	opts := cl.Options()
	opts.Dialer = d.Dial
	cc := redis.NewClusterClient(opts)
	t.Cleanup(func() { _ = cc.Close() })
	got, err := cc.Incr(ctx, prefix+":{n}").Result()
	require.NoError(t, err)
	require.Equal(t, int64(2), got, "the cluster client re-sends too")
}

// TestStartCluster starts a private cluster, which a test may take apart,
// and checks that cleanup stops its nodes.
func TestStartCluster(t *testing.T) {
	t.Parallel()
	var cl *Cluster
	t.Run("run", func(t *testing.T) {
		cl = StartCluster(t)
		c := cl.Client(t)
		ctx := context.Background()
		for i := range 10 {
			require.NoError(t, c.Set(ctx, fmt.Sprintf("k{%d}", i), i, time.Minute).Err())
		}
		cl.Nodes()[2].Pause(t)
		cl.Nodes()[2].Resume(t)
		require.NoError(t, c.Ping(ctx).Err())
	})
	require.NotNil(t, cl)
	for _, n := range cl.Nodes() {
		require.False(t, n.Running(), "node %s outlived its test", n.Addr())
	}
}

func TestClusterSharedIsNotStoppable(t *testing.T) {
	t.Parallel()
	// Stop on a shared node must fail the test, not take the node down.
	cl := SharedCluster(t)
	ft := &fatalRecorder{TB: t}
	func() {
		defer func() { _ = recover() }()
		cl.Nodes()[0].Stop(ft)
	}()
	require.True(t, ft.failed)
	require.True(t, cl.Nodes()[0].Running())
}

// fatalRecorder records Fatalf instead of failing, and stops the caller.
type fatalRecorder struct {
	testing.TB
	failed bool
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.failed = true
	panic(errors.New("fatal"))
}
