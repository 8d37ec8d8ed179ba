package redistest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterSize is the number of masters; there are no replicas.
const clusterSize = 3

// A Cluster is a Redis Cluster of three masters on 127.0.0.1, without
// replicas, the 16384 slots split evenly between them.
type Cluster struct {
	nodes []*Server
}

// StartCluster starts a three-master Redis Cluster, waits until every node
// reports cluster_state:ok and registers its termination with tb.Cleanup.
// Startup takes about two seconds: a fresh master refuses to report the
// cluster as ok sooner. It skips the test when redis-server is not on PATH
// (see RequireEnv); redis-cli is not needed.
func StartCluster(tb testing.TB, opts ...Option) *Cluster {
	tb.Helper()
	server := lookPath(tb, "redis-server", skipServer)
	var c config
	for _, o := range opts {
		o(&c)
	}
	dirs := make([]string, clusterSize)
	for i := range dirs {
		dirs[i] = tb.TempDir()
	}
	cl, err := startCluster(server, dirs, c.args)
	if cl != nil {
		tb.Cleanup(cl.stopNow)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return cl
}

// SharedCluster returns a Redis Cluster shared by all tests of the test
// binary, starting it on first use; see Shared for the rules.
func SharedCluster(tb testing.TB) *Cluster {
	tb.Helper()
	server := lookPath(tb, "redis-server", skipServer)
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedCluster == nil && sharedClusterFailure == nil {
		sharedCluster, sharedClusterFailure = startSharedCluster(server)
	}
	if sharedClusterFailure != nil {
		tb.Fatal(sharedClusterFailure)
	}
	return sharedCluster
}

func startSharedCluster(server string) (*Cluster, error) {
	dirs := make([]string, clusterSize)
	for i := range dirs {
		d, err := sharedDir()
		if err != nil {
			return nil, err
		}
		dirs[i] = d
	}
	cl, err := startCluster(server, dirs, nil)
	if err != nil {
		if cl != nil {
			cl.stopNow()
		}
		return nil, err
	}
	for _, n := range cl.nodes {
		n.shared = true
	}
	return cl, nil
}

// startCluster starts the nodes in parallel, joins them and waits for the
// cluster to be ok. On error it returns the nodes started so far.
func startCluster(server string, dirs, args []string) (*Cluster, error) {
	cl := &Cluster{nodes: make([]*Server, len(dirs))}
	errs := make([]error, len(dirs))
	var wg sync.WaitGroup
	for i, dir := range dirs {
		wg.Go(func() {
			cl.nodes[i], errs[i] = startClusterNode(server, dir, args)
		})
	}
	wg.Wait()
	started := cl.nodes[:0:0]
	for _, n := range cl.nodes {
		if n != nil {
			started = append(started, n)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return &Cluster{nodes: started}, err
	}

	if err := cl.join(); err != nil {
		return cl, err
	}
	return cl, cl.waitOK()
}

// startClusterNode starts one cluster-enabled server, with its cluster bus on
// a second free port (not port+10000, which may be taken).
func startClusterNode(path, dir string, args []string) (*Server, error) {
	var err error
	for range 5 {
		var ports []int
		ports, err = freePorts(2)
		if err != nil {
			return nil, err
		}
		nodeArgs := []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-port", strconv.Itoa(ports[1]),
			"--cluster-node-timeout", "5000",
		}
		s := &Server{path: path, dir: dir, port: ports[0], busPort: ports[1], args: append(nodeArgs, args...)}
		if err = s.launch(); err == nil {
			return s, nil
		}
		if !errors.Is(err, errAddrInUse) {
			return nil, err
		}
		_ = os.Remove(filepath.Join(dir, "nodes.conf"))
	}
	return nil, err
}

// join does what redis-cli --cluster create does for masters without
// replicas: it gives each node an equal range of slots and a distinct config
// epoch, and introduces the nodes to each other. Unlike redis-cli, which
// checks the join once a second, waitOK then polls every 10ms.
func (c *Cluster) join() error {
	per := 16384 / len(c.nodes)
	for i, n := range c.nodes {
		first, last := i*per, (i+1)*per-1
		if i == len(c.nodes)-1 {
			last = 16383
		}
		cmds := [][]string{
			{"CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(first), strconv.Itoa(last)},
			{"CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i + 1)},
		}
		for _, m := range c.nodes[:i] { // a full mesh: no waiting for gossip
			cmds = append(cmds, []string{"CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(m.port), strconv.Itoa(m.busPort)})
		}
		for _, cmd := range cmds {
			if _, err := do(n.Addr(), probeTimeout, cmd...); err != nil {
				return fmt.Errorf("redistest: %s on %s: %w", strings.Join(cmd, " "), n.Addr(), err)
			}
		}
	}
	return nil
}

// waitOK polls CLUSTER INFO on every node until each reports the cluster ok,
// all slots assigned and all nodes known.
func (c *Cluster) waitOK() error {
	deadline := time.Now().Add(startTimeout)
	for _, n := range c.nodes {
		for {
			info, err := do(n.Addr(), probeTimeout, "CLUSTER", "INFO")
			if err == nil && clusterReady(info) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("redistest: cluster node %s not ok after %v (err %v):\n%s",
					n.Addr(), startTimeout, err, info)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

func clusterReady(info string) bool {
	want := map[string]string{
		"cluster_state":          "ok",
		"cluster_slots_assigned": "16384",
		"cluster_slots_ok":       "16384",
		"cluster_known_nodes":    strconv.Itoa(clusterSize),
		"cluster_size":           strconv.Itoa(clusterSize),
	}
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if w, ok := want[k]; ok && v == w {
			delete(want, k)
		}
	}
	return len(want) == 0
}

// Addrs returns the addresses of the cluster's masters.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Nodes returns the cluster's masters, for tests that pause or stop one
// (not on a shared cluster).
func (c *Cluster) Nodes() []*Server { return c.nodes }

// Options returns fresh go-redis cluster options for the cluster.
func (c *Cluster) Options() *redis.ClusterOptions {
	return &redis.ClusterOptions{Addrs: c.Addrs()}
}

// Client returns a go-redis cluster client, closed by tb.Cleanup.
func (c *Cluster) Client(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	cc := redis.NewClusterClient(c.Options())
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

// FlushAll removes every key on every master.
func (c *Cluster) FlushAll(tb testing.TB) {
	tb.Helper()
	for _, n := range c.nodes {
		n.FlushAll(tb)
	}
}

// KeySlot returns the cluster hash slot of key, as CLUSTER KEYSLOT computes
// it on the server.
func (c *Cluster) KeySlot(tb testing.TB, key string) int {
	tb.Helper()
	reply, err := do(c.nodes[0].Addr(), probeTimeout, "CLUSTER", "KEYSLOT", key)
	if err != nil {
		tb.Fatalf("redistest: CLUSTER KEYSLOT %q: %v", key, err)
	}
	slot, err := strconv.Atoi(reply)
	if err != nil {
		tb.Fatalf("redistest: CLUSTER KEYSLOT %q: %q", key, reply)
	}
	return slot
}

// stopNow kills every node.
func (c *Cluster) stopNow() {
	for _, n := range c.nodes {
		n.stopNow()
	}
}
