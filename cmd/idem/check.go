package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redisauth"
	"github.com/idemkit/idem/internal/redisinfo"
)

var _ = register("check", func(fs *flag.FlagSet) (func(context.Context, *env) error, bool) {
	prefix := fs.String("prefix", "idem", "key `prefix` of the store (idem.WithPrefix), whose keys and channels are probed")
	strict := fs.Bool("strict", false, "exit 1 on warnings too")
	return func(ctx context.Context, e *env) error { return runCheck(ctx, e, *prefix, *strict) }, false
})

// serverReport is what check reports of one server.
type serverReport struct {
	name        string
	info        map[string]string // INFO server, replication, persistence, memory; nil when refused
	save        string            // CONFIG GET save; "?" when CONFIG is refused
	persistence string
	warnings    []string
}

// runCheck reports every server and runs idem's own start-up check.
func runCheck(ctx context.Context, e *env, prefix string, strict bool) error {
	if len(e.args) > 0 {
		return usageError(e, fmt.Sprintf("check takes no arguments, got %q", e.args))
	}
	var (
		mu      sync.Mutex
		servers []*serverReport
	)
	err := forEachServer(ctx, e, func(ctx context.Context, c *redis.Client, name string) error {
		s, err := describe(ctx, c, name)
		var auth *redisauth.Error
		switch {
		case errors.As(err, &auth):
			return err // it names the server
		case err != nil:
			return fmt.Errorf("%s: %w", name, err)
		}
		mu.Lock()
		defer mu.Unlock()
		servers = append(servers, s)
		return nil
	})
	if err != nil {
		return err
	}
	slices.SortFunc(servers, func(a, b *serverReport) int { return strings.Compare(a.name, b.name) })
	for _, s := range servers {
		s.print(e.stdout)
	}

	// idem's own verdict: RedisStore.Check refuses what it cannot use and
	// logs what it warns about.
	var warnings warningLog
	checkErr := idem.NewRedisStore(e.client, idem.WithPrefix(prefix), idem.WithStoreLogger(slog.New(&warnings))).Check(ctx)
	for _, s := range servers {
		warnings.add(s.warnings...)
	}
	for _, w := range warnings.lines {
		fmt.Fprintf(e.stdout, "warning: %s\n", w)
	}
	switch {
	case checkErr != nil:
		return checkErr
	case strict && len(warnings.lines) > 0:
		return fmt.Errorf("%d warning(s) (-strict)", len(warnings.lines))
	}
	fmt.Fprintf(e.stdout, "ok: idem can use %s (%d warning(s))\n", e.target, len(warnings.lines))
	return nil
}

// describe reads one server's INFO and persistence settings. A server that
// refuses INFO or CONFIG (an ACL user without them, a managed service) is
// described as far as the rest allows, with a warning naming what was not
// verified and how to verify it by hand.
func describe(ctx context.Context, c *redis.Client, name string) (*serverReport, error) {
	s := &serverReport{name: name, save: "?"}
	text, err := c.Info(ctx, "server", "replication", "persistence", "memory").Result()
	switch {
	case redisauth.Refused(err):
		return nil, redisauth.Explain(err, name, c)
	case refused(err):
		s.warnings = append(s.warnings, fmt.Sprintf("%s: INFO refused (%s): server version, eviction policy, persistence and replicas not verified; "+
			"verify by hand: INFO server, memory, persistence and replication as an admin user, or the provider's console", name, reply(err)))
	case err != nil:
		return nil, err
	default:
		s.info = redisinfo.Parse(text)
	}
	cfg, err := c.ConfigGet(ctx, "save").Result()
	switch {
	case refused(err):
		s.warnings = append(s.warnings, fmt.Sprintf("%s: CONFIG refused (%s): RDB snapshots not verified; "+
			"verify by hand: CONFIG GET save as an admin user, or the provider's persistence settings", name, reply(err)))
	case err != nil:
		return nil, err
	default:
		s.save = cfg["save"]
	}
	s.describePersistence()
	return s, nil
}

// refused reports whether err is the server's refusal of a command (an
// error reply: NOPERM, unknown command), not a failure to reach it.
func refused(err error) bool {
	var r redis.Error
	return errors.As(err, &r)
}

// reply returns an error reply on one line, without trailing blanks.
func reply(err error) string {
	return strings.TrimSpace(strings.ReplaceAll(err.Error(), "\n", " "))
}

// describePersistence sets s.persistence from AOF (INFO) and RDB (CONFIG)
// and warns when there is none.
func (s *serverReport) describePersistence() {
	aof := s.info["aof_enabled"] == "1"
	switch {
	case s.info == nil && s.save == "?":
		s.persistence = "not verified (INFO and CONFIG refused)"
	case s.info == nil:
		s.persistence = fmt.Sprintf("AOF not verified (INFO refused), RDB snapshots: save %q", s.save)
	case aof && s.save != "" && s.save != "?":
		s.persistence = fmt.Sprintf("AOF on, RDB snapshots (save %q)", s.save)
	case aof:
		s.persistence = "AOF on"
	case s.save == "":
		s.persistence = "none (AOF off, no RDB snapshots)"
		s.warnings = append(s.warnings, s.name+": no persistence: a restart forgets every claim and stored result, and the keys run again")
	case s.save == "?":
		s.persistence = "AOF off, RDB snapshots not verified (CONFIG refused)"
	default:
		s.persistence = fmt.Sprintf("AOF off, RDB snapshots only (save %q): a restart loses the writes since the last one", s.save)
	}
}

func (s *serverReport) print(w io.Writer) {
	in := s.info
	if in == nil {
		fmt.Fprintf(w, "%s: version, mode and role not verified (INFO refused)\n", s.name)
		fmt.Fprintf(w, "  %-12s %s\n", "eviction", "not verified (INFO refused)")
		fmt.Fprintf(w, "  %-12s %s\n", "persistence", s.persistence)
		fmt.Fprintf(w, "  %-12s %s\n", "replicas", "not verified (INFO refused)")
		return
	}
	srv := redisinfo.ServerOf(in)
	fmt.Fprintf(w, "%s: %s, %s, %s\n", s.name, srv, srv.Mode, in["role"])
	limit := "no maxmemory"
	if in["maxmemory"] != "" && in["maxmemory"] != "0" {
		limit = "maxmemory " + in["maxmemory_human"]
	}
	fmt.Fprintf(w, "  %-12s maxmemory-policy %s, %s, used %s\n", "eviction", in["maxmemory_policy"], limit, in["used_memory_human"])
	fmt.Fprintf(w, "  %-12s %s\n", "persistence", s.persistence)
	fmt.Fprintf(w, "  %-12s %s\n", "replicas", replicas(in))
}

// replicas describes the replicas INFO replication lists on a master.
func replicas(info map[string]string) string {
	if info["role"] != "master" {
		return "this server is a replica of " + info["master_host"] + ":" + info["master_port"]
	}
	n, _ := strconv.Atoi(info["connected_slaves"])
	if n == 0 {
		return "none: a failover has no copy to promote"
	}
	var list []string
	for i := range n {
		f := fields(info["slave"+strconv.Itoa(i)])
		list = append(list, fmt.Sprintf("%s:%s %s, lag %ss", f["ip"], f["port"], f["state"], f["lag"]))
	}
	return fmt.Sprintf("%d (%s); without idem.WithReplicaAck a failover can lose the last claims and results", n, strings.Join(list, "; "))
}

// fields parses "ip=127.0.0.1,port=6380,state=online".
func fields(s string) map[string]string {
	m := map[string]string{}
	for kv := range strings.SplitSeq(s, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

// warningLog is a slog.Handler that keeps warnings as lines.
type warningLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *warningLog) add(lines ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, lines...)
}

func (l *warningLog) Enabled(_ context.Context, level slog.Level) bool {
	return level >= slog.LevelWarn
}

// Handle keeps a warning of RedisStore.Check as a line, but for a refused
// INFO or CONFIG: check describes those itself, server by server.
func (l *warningLog) Handle(_ context.Context, r slog.Record) error {
	line := strings.TrimPrefix(r.Message, "idem: ")
	skip := false
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "event" && (a.Value.String() == "version_unverified" || a.Value.String() == "eviction_unverified") {
			skip = true
		}
		line += fmt.Sprintf(" (%s %v)", a.Key, a.Value)
		return true
	})
	if !skip {
		l.add(line)
	}
	return nil
}

func (l *warningLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *warningLog) WithGroup(string) slog.Handler      { return l }
