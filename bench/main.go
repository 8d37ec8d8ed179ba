// Command bench measures idem against the physical floor of Redis and
// against the alternatives a team would otherwise build, and writes
// RESULTS.md and chart.png. Run it from the bench directory:
//
//	go run .            # full run, about 8 minutes on 2 cores
//	go run . -quick     # smoke run, a few seconds
//
// It starts its own redis-server (and a 3-master Redis Cluster, and
// PostgreSQL when its binaries are present) on 127.0.0.1 in temp dirs, and
// stops them on exit. See README.md for the scenarios.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

type config struct {
	quick       bool
	duration    time.Duration // measured time per variant, split into rounds
	rounds      int
	clients     int
	delay       time.Duration
	levels      []int
	raceKeys    int
	effect      time.Duration
	replayKeys  int
	memRecords  int
	allocRuns   int           // operations per allocation measurement
	notifyKeys  int           // keys of the wake-up lag measurement
	notifyHold  time.Duration // how long the holder keeps a waiter waiting when its commands are counted
	redisAddr   string
	cluster     string // "" start one, "off", or comma-separated addresses
	pg          string // "" start one, "off", or a DSN
	pgSync      string
	redisServer string
	redisCLI    string
	out         string
	only        []string
	cpuprofile  string
}

var scenarioNames = []string{"floor", "allocs", "http", "grpc", "sql", "idemsql", "race", "scale", "memory", "peers", "replicas", "notify", "canon", "sealed", "autopipe", "batching", "proxy", "freeze"}

func parseFlags(args []string) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.BoolVar(&c.quick, "quick", false, "smoke run: a few seconds, numbers are noise")
	fs.DurationVar(&c.duration, "duration", 4*time.Second, "measured time per variant (split into -rounds rounds)")
	fs.IntVar(&c.rounds, "rounds", 32, "rounds per variant; the variants of a comparison alternate round by round")
	fs.IntVar(&c.clients, "clients", 16, "concurrent clients for floor, HTTP, gRPC, SQL and contention")
	fs.DurationVar(&c.delay, "delay", 500*time.Microsecond, "simulated network delay per round trip in the second floor run")
	levels := fs.String("levels", "1,4,16,64", "client concurrency levels for the scale scenario")
	fs.IntVar(&c.raceKeys, "race-keys", 200, "keys in the contention scenario (each hit by -clients goroutines at once)")
	fs.DurationVar(&c.effect, "effect", 500*time.Microsecond, "duration of the side effect in the contention scenario")
	fs.IntVar(&c.replayKeys, "replay-keys", 2000, "pre-completed keys that replays cycle over")
	fs.IntVar(&c.memRecords, "mem-records", 50, "records per kind in the memory scenario")
	fs.IntVar(&c.allocRuns, "alloc-runs", 2000, "operations per allocation measurement (one goroutine)")
	fs.IntVar(&c.notifyKeys, "notify-keys", 50, "keys of the wake-up lag measurement (one waiter each)")
	fs.DurationVar(&c.notifyHold, "notify-hold", 1500*time.Millisecond, "how long a waiter waits while its commands are counted")
	fs.StringVar(&c.redisAddr, "redis", "", "use this Redis (host:port) instead of starting redis-server; keys get TTLs, nothing is flushed")
	fs.StringVar(&c.cluster, "cluster", "", `"off", or comma-separated cluster node addresses; default: start a local 3-master cluster`)
	fs.StringVar(&c.pg, "pg", "", `"off", or a PostgreSQL DSN; default: start a temp cluster when initdb/pg_ctl are present (tables idem_bench_* are dropped and created)`)
	fs.StringVar(&c.pgSync, "pg-synchronous-commit", "off", "synchronous_commit of the PostgreSQL this command starts")
	fs.StringVar(&c.redisServer, "redis-server", "redis-server", "redis-server binary")
	fs.StringVar(&c.redisCLI, "redis-cli", "redis-cli", "redis-cli binary (cluster creation)")
	fs.StringVar(&c.out, "out", ".", "directory for RESULTS.md and chart.png")
	only := fs.String("only", "", "comma-separated scenarios to run: "+strings.Join(scenarioNames, ","))
	fs.StringVar(&c.cpuprofile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if c.quick {
		def := func(name string, f func()) {
			if !set[name] {
				f()
			}
		}
		def("duration", func() { c.duration = 100 * time.Millisecond })
		def("rounds", func() { c.rounds = 2 })
		def("levels", func() { *levels = "1,16" })
		def("race-keys", func() { c.raceKeys = 20 })
		def("replay-keys", func() { c.replayKeys = 100 })
		def("mem-records", func() { c.memRecords = 5 })
		def("alloc-runs", func() { c.allocRuns = 50 })
		def("notify-keys", func() { c.notifyKeys = 5 })
		def("notify-hold", func() { c.notifyHold = 200 * time.Millisecond })
	}
	for _, s := range strings.Split(*levels, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 1024 {
			return nil, fmt.Errorf("-levels: bad level %q", s)
		}
		c.levels = append(c.levels, n)
	}
	if *only != "" {
		for _, s := range strings.Split(*only, ",") {
			if !slices.Contains(scenarioNames, s) {
				return nil, fmt.Errorf("-only: unknown scenario %q (have %s)", s, strings.Join(scenarioNames, ","))
			}
			c.only = append(c.only, s)
		}
	}
	switch {
	case c.rounds < 1 || c.rounds > 1000:
		return nil, errors.New("-rounds must be in [1,1000]")
	case c.duration <= 0 || c.duration > 10*time.Minute:
		return nil, errors.New("-duration must be in (0,10m]")
	case c.clients < 1 || c.clients > 1024:
		return nil, errors.New("-clients must be in [1,1024]")
	case c.replayKeys < 1 || c.memRecords < 1 || c.raceKeys < 1:
		return nil, errors.New("-replay-keys, -mem-records and -race-keys must be positive")
	case c.allocRuns < 1 || c.allocRuns > 1_000_000 || c.notifyKeys < 1 || c.notifyKeys > 10_000:
		return nil, errors.New("-alloc-runs must be in [1,1e6], -notify-keys in [1,10000]")
	case c.notifyHold <= 0 || c.notifyHold > time.Minute:
		return nil, errors.New("-notify-hold must be in (0,1m]")
	}
	return c, nil
}

func (c *config) runs(name string) bool { return len(c.only) == 0 || slices.Contains(c.only, name) }

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// run performs the whole benchmark: servers up, scenarios, report, servers down.
func run(ctx context.Context, cfg *config) (err error) {
	if cfg.cpuprofile != "" {
		f, err := os.Create(cfg.cpuprofile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	srv := &servers{}
	defer srv.stop()
	rep := &report{cfg: cfg, started: time.Now(), loadStart: loadAvg()}
	if l, err := strconv.ParseFloat(rep.loadStart, 64); err == nil && l > float64(runtime.NumCPU())/2 {
		progress("warning: load average %.1f on %d CPUs: other work will skew the numbers", l, runtime.NumCPU())
	}
	e := &env{cfg: cfg, nonce: newNonce(), rep: rep}
	defer e.close()

	// Redis, standalone.
	if cfg.redisAddr != "" {
		e.redisAddr = cfg.redisAddr
		rep.notes = append(rep.notes, "Redis given by -redis "+cfg.redisAddr)
	} else {
		progress("starting redis-server on 127.0.0.1 (no persistence)")
		if e.redisAddr, err = srv.startRedis(ctx, cfg.redisServer); err != nil {
			return err
		}
	}
	e.admin = redis.NewClient(&redis.Options{Addr: e.redisAddr})
	e.onClose(func() { e.admin.Close() })
	info, err := e.admin.InfoMap(ctx, "server").Result()
	if err != nil {
		return fmt.Errorf("redis at %s: %w", e.redisAddr, err)
	}
	rep.redisVersion = info["Server"]["redis_version"]

	// Redis Cluster, for the scale and auto-pipelining scenarios.
	if cfg.runs("scale") || cfg.runs("autopipe") {
		switch cfg.cluster {
		case "off":
			e.clusterNote = "-cluster off"
		case "":
			progress("starting a 3-master Redis Cluster on 127.0.0.1")
			if _, lerr := exec.LookPath(cfg.redisCLI); lerr != nil {
				e.clusterNote = "redis-cli not found"
			} else if addrs, cerr := srv.startCluster(ctx, cfg.redisServer, cfg.redisCLI); cerr != nil {
				e.clusterNote = "starting the cluster failed: " + firstLine(cerr.Error())
				progress("  %s", e.clusterNote)
			} else {
				e.clusterAddrs = addrs
				e.clusterNote = strings.Join(addrs, ", ")
			}
		default:
			e.clusterAddrs = strings.Split(cfg.cluster, ",")
			e.clusterNote = cfg.cluster
		}
	}

	// PostgreSQL, for the SQL scenario.
	if cfg.runs("sql") || cfg.runs("idemsql") {
		switch cfg.pg {
		case "off":
			e.pgNote = "-pg off"
		case "":
			progress("starting PostgreSQL on 127.0.0.1 (temp cluster)")
			if dsn, perr := srv.startPostgres(ctx, cfg.pgSync); perr != nil {
				e.pgNote = "PostgreSQL not available: " + firstLine(perr.Error())
				progress("  %s", e.pgNote)
			} else {
				e.pgDSN = dsn
			}
		default:
			e.pgDSN = cfg.pg
		}
	}

	scenarios := []struct {
		name string
		run  func(context.Context, *env) error
	}{
		{"floor", runFloor}, {"allocs", runAllocs}, {"http", runHTTP}, {"grpc", runGRPC}, {"sql", runSQL}, {"idemsql", runIdemSQL}, {"race", runRace}, {"scale", runScale}, {"memory", runMemory}, {"peers", runPeers}, {"replicas", runReplicas}, {"notify", runNotify}, {"canon", runCanon}, {"sealed", runSealed}, {"autopipe", runAutoPipe}, {"batching", runBatching},
		{"proxy", runProxy}, {"freeze", runFreeze},
	}
	for _, s := range scenarios {
		if !cfg.runs(s.name) {
			continue
		}
		if err := e.emptyServers(ctx); err != nil {
			return fmt.Errorf("before scenario %s: %w", s.name, err)
		}
		t := time.Now()
		if err := s.run(ctx, e); err != nil {
			return fmt.Errorf("scenario %s: %w", s.name, err)
		}
		rep.timings = append(rep.timings, timing{s.name, time.Since(t)})
		progress("scenario %s took %s", s.name, time.Since(t).Round(100*time.Millisecond))
	}
	rep.finished, rep.loadEnd = time.Now(), loadAvg()
	if err := rep.write(cfg.out); err != nil {
		return err
	}
	progress("wrote %s/RESULTS.md and %s/chart.png in %s", cfg.out, cfg.out, rep.finished.Sub(rep.started).Round(time.Second))
	for _, t := range rep.targets {
		res := "PASS"
		if !t.pass {
			res = "MISS"
		}
		progress("  %-4s %-70s %s (want %s)", res, t.name, t.got, t.want)
	}
	return nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
