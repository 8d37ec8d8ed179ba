package redistest

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestParseReplication(t *testing.T) {
	tests := []struct {
		name string
		info string
		want Replication
		lag  map[string]int64
	}{
		{
			name: "primary with replicas",
			info: "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n" +
				"slave0:ip=127.0.0.1,port=6380,state=online,offset=900,lag=0\r\n" +
				"slave1:ip=127.0.0.1,port=6381,state=wait_bgsave,offset=0,lag=1\r\n" +
				"master_failover_state:no-failover\r\nmaster_replid:abc\r\n" +
				"master_repl_offset:1000\r\nsecond_repl_offset:-1\r\n",
			want: Replication{Role: "master", Offset: 1000, SwitchOffset: -1, Replicas: []ReplicaState{
				{Addr: "127.0.0.1:6380", State: "online", Offset: 900},
				{Addr: "127.0.0.1:6381", State: "wait_bgsave", Offset: 0},
			}},
			lag: map[string]int64{"127.0.0.1:6380": 100, "127.0.0.1:6381": 1000},
		},
		{
			name: "promoted replica",
			info: "role:master\nconnected_slaves:0\nmaster_repl_offset:5000\nsecond_repl_offset:4001\n",
			want: Replication{Role: "master", Offset: 5000, SwitchOffset: 4000},
			lag:  map[string]int64{},
		},
		{
			name: "replica",
			info: "role:slave\nmaster_host:127.0.0.1\nslave_repl_offset:77\nmaster_repl_offset:77\n",
			want: Replication{Role: "slave", Offset: 77, SwitchOffset: -1},
			lag:  map[string]int64{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := parseReplication(tt.info)
			require.Equal(t, tt.want, got)
			require.Equal(t, tt.lag, got.Lag())
		})
	}
}

// TestSentinelFailover walks through what a failover test does: replicas
// paused until they lag, the primary killed, the replicas resumed, a replica
// promoted by the Sentinels, and a failover client following it.
func TestSentinelFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("a Sentinel failover takes seconds")
	}
	ctx := context.Background()
	f := StartFailover(t)
	nodes := f.Nodes()
	require.Len(t, nodes, 3)
	require.Equal(t, "redistest", f.MasterName())
	require.Len(t, f.SentinelAddrs(), 3)
	old := f.Primary(t)
	require.Same(t, nodes[0], old)
	require.Equal(t, nodes[1:], f.Replicas(t))
	require.Equal(t, "master", old.Replication(t).Role)
	require.Equal(t, "slave", nodes[1].Replication(t).Role)

	c := f.Client(t)
	// WAIT counts the writes of its own connection: a pipeline keeps both
	// on one.
	var wait *redis.IntCmd
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "before", "kept", time.Minute)
		wait = redis.NewIntCmd(ctx, "WAIT", 2, 5000)
		_ = p.Process(ctx, wait)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, int64(2), wait.Val(), "both replicas have the key")

	// Paused replicas read nothing: socket buffers fill first, then the
	// primary's own output buffers, which a kill destroys.
	for _, r := range f.Replicas(t) {
		r.Pause(t)
	}
	value := strings.Repeat("x", 64<<10)
	var unsent map[string]int64
	for i := 0; len(unsent) < 2 || slices.Min(slices.Collect(maps.Values(unsent))) < 128<<10; i++ {
		require.Less(t, i, 1024, "64 MiB written and still not 128 KiB unsent: %v", unsent)
		require.NoError(t, c.Set(ctx, fmt.Sprintf("junk:%d", i), value, time.Minute).Err())
		unsent = old.Unsent(t)
	}
	lag := f.ReplicaLag(t)
	require.Len(t, lag, 2)
	for _, r := range nodes[1:] {
		require.Greater(t, lag[r.Addr()], int64(128<<10), "paused replica %s", r.Addr())
	}

	offset := old.Replication(t).Offset
	old.Kill(t)
	for _, r := range nodes[1:] {
		r.Resume(t)
	}
	start := time.Now()
	p := f.WaitFailover(t, old, 20*time.Second)
	t.Logf("failover took %v", time.Since(start).Round(time.Millisecond))
	require.Contains(t, nodes[1:], p)
	require.Same(t, p, f.Primary(t))
	// The Sentinels still reconfigure the other replica: settled, they
	// agree on p, with no failover flag, for longer than down-after.
	start = time.Now()
	require.Same(t, p, f.WaitSettled(t, 20*time.Second))
	settled := time.Since(start)
	t.Logf("the sentinels settled %v after the failover", settled.Round(time.Millisecond))
	require.Greater(t, settled, downAfter, "settled means settled for longer than down-after")
	for _, s := range f.sentinels {
		m, err := sentinelQuery(s.addr(), func(c *redis.SentinelClient) (map[string]string, error) {
			return c.Master(ctx, masterName).Result()
		})
		require.NoError(t, err)
		require.Equal(t, "master", m["flags"], "sentinel %s", s.addr())
		require.Equal(t, p.Addr(), net.JoinHostPort(m["ip"], m["port"]), "sentinel %s", s.addr())
	}
	rep := p.Replication(t)
	require.Equal(t, "master", rep.Role)
	require.GreaterOrEqual(t, rep.SwitchOffset, int64(0), "a promoted replica switched history")
	missed := offset - rep.SwitchOffset
	t.Logf("unsent at the kill %v, the promoted replica missed %d bytes", unsent, missed)
	require.GreaterOrEqual(t, missed, int64(128<<10)-16<<10, "what was unsent is lost")

	require.Equal(t, "kept", c.Get(ctx, "before").Val(), "the failover client follows the new primary")
	require.NoError(t, c.Set(ctx, "after", "1", time.Minute).Err())
	require.NotContains(t, f.Replicas(t), old, "a killed node is no replica")
}
