package redistest

import (
	"net"
	"strconv"
	"strings"
	"testing"
)

// Replication is the replication state a server reports in INFO
// replication.
type Replication struct {
	Role string // "master" or "slave"
	// Offset is master_repl_offset: the bytes of replication stream the
	// server produced as a primary, or processed as a replica.
	Offset int64
	// SwitchOffset is the offset at which the server's history last
	// switched to a new replication ID (second_repl_offset minus one): on a
	// promoted replica, the offset it had reached when promoted; -1 if never.
	SwitchOffset int64
	Replicas     []ReplicaState // the replicas connected to a primary
}

// ReplicaState is one replica as its primary reports it.
type ReplicaState struct {
	Addr   string // the address the replica listens on
	State  string // "online" once in sync
	Offset int64  // the offset the replica last acknowledged
}

// Lag returns, for each replica, keyed by its address, how many bytes of
// the replication stream it has not acknowledged: Offset minus its offset.
func (r Replication) Lag() map[string]int64 {
	lag := make(map[string]int64, len(r.Replicas))
	for _, rs := range r.Replicas {
		lag[rs.Addr] = r.Offset - rs.Offset
	}
	return lag
}

// Replication returns the server's INFO replication, or fails the test.
func (s *Server) Replication(tb testing.TB) Replication {
	tb.Helper()
	info, err := do(s.Addr(), probeTimeout, "INFO", "replication")
	if err != nil {
		tb.Fatalf("redistest: INFO replication on %s: %v", s.Addr(), err)
	}
	return parseReplication(info)
}

// replication returns the server's INFO replication, empty on error.
func (s *Server) replication() Replication {
	info, _ := do(s.Addr(), probeTimeout, "INFO", "replication")
	return parseReplication(info)
}

// Unsent returns, for each replica connected to s, keyed by the address
// of its connection (an ephemeral port, not the port it listens on), how
// many bytes of replication stream s holds for it in its own output buffer
// (CLIENT LIST omem, which may count up to 16 KiB already sent): what a
// SIGKILL of s destroys. Unacknowledged lag (Replication.Lag) is not that:
// on loopback, socket buffers can hold megabytes that a paused replica has
// not read, and the kernel still delivers them after s died.
func (s *Server) Unsent(tb testing.TB) map[string]int64 {
	tb.Helper()
	list, err := do(s.Addr(), probeTimeout, "CLIENT", "LIST", "TYPE", "replica")
	if err != nil {
		tb.Fatalf("redistest: CLIENT LIST on %s: %v", s.Addr(), err)
	}
	unsent := make(map[string]int64)
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		if c := fields(line, " "); c["addr"] != "" {
			unsent[c["addr"]], _ = strconv.ParseInt(c["omem"], 10, 64)
		}
	}
	return unsent
}

// parseReplication parses the text of INFO replication.
func parseReplication(info string) Replication {
	r := Replication{SwitchOffset: -1}
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch {
		case k == "role":
			r.Role = v
		case k == "master_repl_offset":
			r.Offset, _ = strconv.ParseInt(v, 10, 64)
		case k == "second_repl_offset":
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 {
				r.SwitchOffset = n - 1
			}
		case strings.HasPrefix(k, "slave") && strings.Contains(v, "ip="):
			// slave0:ip=127.0.0.1,port=6380,state=online,offset=123,lag=0
			f := fields(v, ",")
			offset, _ := strconv.ParseInt(f["offset"], 10, 64)
			r.Replicas = append(r.Replicas, ReplicaState{
				Addr: net.JoinHostPort(f["ip"], f["port"]), State: f["state"], Offset: offset})
		}
	}
	return r
}

// fields parses name=value pairs separated by sep.
func fields(s, sep string) map[string]string {
	m := make(map[string]string)
	for _, f := range strings.Split(strings.TrimSpace(s), sep) {
		if name, val, ok := strings.Cut(f, "="); ok {
			m[name] = val
		}
	}
	return m
}
