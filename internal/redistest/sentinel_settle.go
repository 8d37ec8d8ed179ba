package redistest

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// WaitSettled waits up to timeout until the Sentinels have settled: for
// longer than their down-after, a majority of them report the same primary,
// every Sentinel that answers reports it with no flag but master (no
// s_down, o_down or failover_in_progress), and that node runs, has the
// master role and accepts a write. A failover the Sentinels started on their
// own, on a primary frozen past down-after on a loaded machine, is then
// over, and none is about to start. It returns that primary, or fails the
// test with the Sentinels' logs.
func (f *Failover) WaitSettled(tb testing.TB, timeout time.Duration) *Server {
	tb.Helper()
	var (
		held  *Server
		since time.Time
	)
	err := poll(timeout, func() error {
		n, err := f.settledNow()
		if n != held || err != nil {
			held, since = n, time.Now()
		}
		switch {
		case err != nil:
			return err
		case time.Since(since) <= downAfter:
			return fmt.Errorf("%s has been the settled primary for %v only", n.Addr(), time.Since(since).Round(time.Millisecond))
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("redistest: the sentinels did not settle in %v: %v\n%s", timeout, err, f.sentinelLogs())
	}
	return held
}

// settledNow returns the primary when the Sentinels agree on it now, as
// WaitSettled describes, or why not.
func (f *Failover) settledNow() (*Server, error) {
	n, err := f.answeringPrimary(nil)
	if err != nil {
		return nil, err
	}
	for _, s := range f.sentinels {
		m, err := sentinelQuery(s.addr(), func(c *redis.SentinelClient) (map[string]string, error) {
			return c.Master(context.Background(), masterName).Result()
		})
		if err != nil {
			continue // a majority answered for n
		}
		if addr := net.JoinHostPort(m["ip"], m["port"]); addr != n.Addr() || m["flags"] != "master" {
			return nil, fmt.Errorf("sentinel %s reports %s with the flags %q", s.addr(), addr, m["flags"])
		}
	}
	return n, nil
}

// sentinelLogs returns the log of every Sentinel, for a failure message.
func (f *Failover) sentinelLogs() string {
	var logs strings.Builder
	for _, s := range f.sentinels {
		fmt.Fprintf(&logs, "--- sentinel %s:\n%s\n", s.addr(), readLog(s.logPath()))
	}
	return logs.String()
}
