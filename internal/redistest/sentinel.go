package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	skipSentinel = "redis-sentinel not on PATH: install Debian's redis-sentinel to run the failover tests"

	masterName   = "redistest" // the name under which the sentinels monitor the primary
	replicaCount = 2
	sentinels    = 3
	quorum       = 2 // sentinels that must agree that the primary is down
	// downAfter is how long a node must not answer before a sentinel deems
	// it down. 1s gave a spurious second failover on a loaded machine.
	downAfter = 1500 * time.Millisecond
	// failoverTimeout bounds one failover attempt; a failed one is retried
	// after twice that.
	failoverTimeout = 6 * time.Second
)

// A Failover is a primary, two replicas and three Sentinels, all on
// 127.0.0.1, each process in its own directory. The data nodes are Servers:
// a test pauses (SIGSTOP), resumes (SIGCONT) and kills (SIGKILL) them with
// the Server methods, and the Sentinels promote a replica once the primary
// has not answered for 1.5s (quorum 2). Its methods may be called from any
// goroutine.
type Failover struct {
	nodes     []*Server // nodes[0] is the first primary
	sentinels []*sentinel
}

// A sentinel is a redis-sentinel process.
type sentinel struct {
	dir  string
	port int
	proc *process
}

func (s *sentinel) addr() string    { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }
func (s *sentinel) logPath() string { return filepath.Join(s.dir, "sentinel.log") }

// StartFailover starts a primary, two replicas (replicaof the primary) and
// three Sentinels monitoring it (quorum 2, down-after-milliseconds 1500,
// failover-timeout 6000), waits until both replicas are in sync and every
// Sentinel knows both replicas and the two other Sentinels, and registers the
// termination of every process with tb.Cleanup. Startup takes about two
// seconds, most of it Sentinels discovering each other. Options apply to the
// primary and the replicas. It skips the test when redis-server or
// redis-sentinel is not on PATH (see RequireEnv).
func StartFailover(tb testing.TB, opts ...Option) *Failover {
	tb.Helper()
	server := lookPath(tb, "redis-server", skipServer)
	sentinelPath := lookPath(tb, "redis-sentinel", skipSentinel)
	var c config
	for _, o := range opts {
		o(&c)
	}
	// Directories first: tb.Cleanup runs last in first out, and they must
	// be removed after the processes have ended.
	dirs := make([]string, 1+replicaCount+sentinels)
	for i := range dirs {
		dirs[i] = tb.TempDir()
	}
	f := &Failover{sentinels: make([]*sentinel, sentinels)}
	tb.Cleanup(f.stopNow)

	// No 5s wait for more replicas before a diskless full sync.
	args := append([]string{"--repl-diskless-sync-delay", "0"}, c.args...)
	for i, dir := range dirs[:1+replicaCount] {
		nodeArgs := args
		if i > 0 {
			nodeArgs = append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(f.nodes[0].port)}, args...)
		}
		n, err := startServer(server, dir, nodeArgs)
		if err != nil {
			tb.Fatal(err)
		}
		f.nodes = append(f.nodes, n)
	}
	if err := f.waitReplicas(); err != nil {
		tb.Fatal(err)
	}
	if err := f.startSentinels(sentinelPath, dirs[1+replicaCount:]); err != nil {
		tb.Fatal(err)
	}
	return f
}

// waitReplicas waits until both replicas are in sync with the primary.
func (f *Failover) waitReplicas() error {
	return poll(startTimeout, func() error {
		online := 0
		for _, r := range f.nodes[0].replication().Replicas {
			if r.State == "online" {
				online++
			}
		}
		if online < replicaCount {
			return fmt.Errorf("redistest: %d of %d replicas in sync after %v", online, replicaCount, startTimeout)
		}
		return nil
	})
}

// startSentinels starts the Sentinels in dirs and waits until each knows the
// replicas and the other Sentinels: only a Sentinel that knows the others
// can reach a quorum and elect a leader, only one that knows the replicas
// can promote one.
func (f *Failover) startSentinels(path string, dirs []string) error {
	errs := make([]error, sentinels)
	var wg sync.WaitGroup
	for i, dir := range dirs {
		wg.Go(func() { f.sentinels[i], errs[i] = startSentinel(path, dir, f.nodes[0].port) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, s := range f.sentinels {
		err := poll(startTimeout, func() error {
			m, err := sentinelQuery(s.addr(), func(c *redis.SentinelClient) (map[string]string, error) {
				return c.Master(context.Background(), masterName).Result()
			})
			if err == nil && (m["flags"] != "master" || m["num-slaves"] != strconv.Itoa(replicaCount) ||
				m["num-other-sentinels"] != strconv.Itoa(sentinels-1)) {
				err = fmt.Errorf("not ready: %v", m)
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("redistest: sentinel %s after %v: %v\n%s", s.addr(), startTimeout, err, readLog(s.logPath()))
		}
	}
	return nil
}

// startSentinel starts a sentinel in dir with its own config file, retrying
// on a fresh port when another process grabbed the chosen one in between.
func startSentinel(path, dir string, primaryPort int) (*sentinel, error) {
	var err error
	for range 5 {
		var ports []int
		if ports, err = freePorts(1); err != nil {
			return nil, err
		}
		s := &sentinel{dir: dir, port: ports[0]}
		conf := filepath.Join(dir, "sentinel.conf") // Sentinel rewrites it
		text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndaemonize no\nlogfile \"\"\ndir %q\n", s.port, dir) +
			fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d %d\n", masterName, primaryPort, quorum) +
			fmt.Sprintf("sentinel down-after-milliseconds %s %d\n", masterName, downAfter.Milliseconds()) +
			fmt.Sprintf("sentinel failover-timeout %s %d\n", masterName, failoverTimeout.Milliseconds()) +
			fmt.Sprintf("sentinel parallel-syncs %s 1\n", masterName)
		if err = os.WriteFile(conf, []byte(text), 0o644); err != nil {
			return nil, err
		}
		if s.proc, err = spawn(path, []string{conf}, dir, s.logPath()); err != nil {
			return nil, fmt.Errorf("redistest: start redis-sentinel: %w", err)
		}
		if err = waitReady(s.proc, s.addr(), nil, s.logPath()); err == nil {
			return s, nil
		}
		s.proc.kill()
		if !errors.Is(err, errAddrInUse) {
			return nil, err
		}
	}
	return nil, err
}

// poll calls check every 20ms until it returns nil, for at most timeout,
// and returns its last error.
func poll(timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sentinelQuery runs query on a client of the sentinel at addr, closed when
// it returns: no connection outlives a probe.
func sentinelQuery[T any](addr string, query func(c *redis.SentinelClient) (T, error)) (T, error) {
	c := redis.NewSentinelClient(&redis.Options{Addr: addr, DialTimeout: probeTimeout,
		ReadTimeout: probeTimeout, WriteTimeout: probeTimeout, MaxRetries: -1, PoolSize: 1})
	defer c.Close()
	return query(c)
}

// MasterName returns the name under which the Sentinels monitor the primary.
func (f *Failover) MasterName() string { return masterName }

// SentinelAddrs returns the addresses of the Sentinels.
func (f *Failover) SentinelAddrs() []string {
	addrs := make([]string, len(f.sentinels))
	for i, s := range f.sentinels {
		addrs[i] = s.addr()
	}
	return addrs
}

// FailoverOptions returns fresh go-redis options for redis.NewFailoverClient
// (master name and Sentinel addresses), for tests to set pool options on.
func (f *Failover) FailoverOptions() *redis.FailoverOptions {
	return &redis.FailoverOptions{MasterName: masterName, SentinelAddrs: f.SentinelAddrs()}
}

// Client returns a go-redis failover client, closed by tb.Cleanup.
func (f *Failover) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewFailoverClient(f.FailoverOptions())
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Nodes returns the data nodes in start order: the first primary, then the
// two replicas, whatever their role now.
func (f *Failover) Nodes() []*Server { return f.nodes }

// Primary returns the node that a majority of the Sentinels report as the
// primary (SENTINEL GET-MASTER-ADDR-BY-NAME). It fails the test when there is
// no majority, as may happen during a failover: see WaitFailover.
func (f *Failover) Primary(tb testing.TB) *Server {
	tb.Helper()
	n, why := f.primary()
	if n == nil {
		tb.Fatalf("redistest: Primary: %s", why)
	}
	return n
}

// Replicas returns the running data nodes other than Primary, in start
// order. Paused nodes count as running.
func (f *Failover) Replicas(tb testing.TB) []*Server {
	tb.Helper()
	p := f.Primary(tb)
	var rs []*Server
	for _, n := range f.nodes {
		if n != p && n.Running() {
			rs = append(rs, n)
		}
	}
	return rs
}

// ReplicaLag returns Primary's Replication().Lag(): how many bytes of its
// replication stream each replica has not acknowledged. Replicas acknowledge
// once a second, and bytes a paused replica has not acknowledged may still
// reach it after the primary died: see Server.Unsent for what a kill loses.
func (f *Failover) ReplicaLag(tb testing.TB) map[string]int64 {
	tb.Helper()
	return f.Primary(tb).Replication(tb).Lag()
}

// WaitFailover waits up to timeout until a majority of the Sentinels report
// a primary other than old, and that node runs, has the master role and
// accepts a write (a SET of redistest:probe, which expires in a second). It
// returns the new primary, or fails the test with the Sentinels' logs. With
// a nil old it waits for any such primary, which a failover still under way
// may replace: WaitSettled waits until the Sentinels have settled.
func (f *Failover) WaitFailover(tb testing.TB, old *Server, timeout time.Duration) *Server {
	tb.Helper()
	var n *Server
	err := poll(timeout, func() (err error) {
		n, err = f.answeringPrimary(old)
		return err
	})
	if err != nil {
		tb.Fatalf("redistest: no new primary after %v: %v\n%s", timeout, err, f.sentinelLogs())
	}
	return n
}

// answeringPrimary returns the node a majority of the Sentinels report as
// the primary, when it is not old, runs, has the master role and accepts a
// write (a SET of redistest:probe, which expires in a second); else why not.
func (f *Failover) answeringPrimary(old *Server) (*Server, error) {
	switch n, why := f.primary(); {
	case n == nil:
		return nil, errors.New(why)
	case old != nil && n == old:
		return nil, fmt.Errorf("the sentinels still report the old primary %s", n.Addr())
	case !n.Running():
		return nil, fmt.Errorf("the sentinels report %s, which is not running", n.Addr())
	default:
		if role := n.replication().Role; role != "master" {
			return nil, fmt.Errorf("%s has the role %q", n.Addr(), role)
		}
		if _, err := do(n.Addr(), probeTimeout, "SET", "redistest:probe", "1", "PX", "1000"); err != nil {
			return nil, err
		}
		return n, nil
	}
}

// primary returns the node a majority of the sentinels report as the
// primary, or nil and why not.
func (f *Failover) primary() (*Server, string) {
	reports := make([]string, len(f.sentinels))
	var wg sync.WaitGroup
	for i, s := range f.sentinels {
		wg.Go(func() {
			hp, err := sentinelQuery(s.addr(), func(c *redis.SentinelClient) ([]string, error) {
				return c.GetMasterAddrByName(context.Background(), masterName).Result()
			})
			if err == nil && len(hp) == 2 {
				reports[i] = net.JoinHostPort(hp[0], hp[1])
			}
		})
	}
	wg.Wait()
	votes := make(map[string]int)
	for _, a := range reports {
		if votes[a]++; a != "" && votes[a] > len(f.sentinels)/2 {
			for _, n := range f.nodes {
				if n.Addr() == a {
					return n, ""
				}
			}
		}
	}
	return nil, fmt.Sprintf("no majority of the sentinels reports a node as the primary: %q", reports)
}

// stopNow kills every process, the sentinels first so that they do not act
// on the nodes going down.
func (f *Failover) stopNow() {
	for _, s := range f.sentinels {
		if s != nil {
			s.proc.kill()
		}
	}
	for _, n := range f.nodes {
		n.stopNow()
	}
}
