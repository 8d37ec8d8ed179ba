package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// report collects what the scenarios measured and writes RESULTS.md.
type report struct {
	cfg             *config
	started         time.Time
	finished        time.Time
	redisVersion    string
	pgVersion       string
	sections        []*section
	targets         []target
	mem             []memRow
	scaleStandalone []scalePoint
	scaleCluster    []scalePoint
	raceClients     int
	raceEffect      time.Duration
	naive, guarded  *raceSide
	notes           []string
	chartExtra      []chartRatio // ratio bars without a target
	peers           *peersData   // scenario 7, for the chart
	timings         []timing     // wall time per scenario
	loadStart       string
	loadEnd         string
}

// loadAvg returns the 1-minute load average, from /proc/loadavg.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

// timing is how long one scenario took, set-up included.
type timing struct {
	name string
	took time.Duration
}

type section struct {
	title, note string
	pairs       [][2]*variant
	body        string // custom markdown after the note
}

type target struct {
	name, short string
	got, want   string
	value       float64 // for the chart: the measured ratio (ratio targets only)
	goal        float64
	ratio       bool
	pass        bool
}

func (r *report) section(title, note string) *section {
	s := &section{title: title, note: note}
	r.sections = append(r.sections, s)
	return s
}

// pair adds a baseline and the variant compared with it.
func (s *section) pair(base, v *variant) { s.pairs = append(s.pairs, [2]*variant{base, v}) }

// costRatio is base's CPU per operation (client + server) over v's: the
// throughput ratio a purely CPU-bound machine would show.
func costRatio(base, v *variant) float64 {
	b, c := base.cliUsecPerOp()+base.srvUsecPerOp(), v.cliUsecPerOp()+v.srvUsecPerOp()
	if math.IsNaN(b) || math.IsNaN(c) || c == 0 {
		return math.NaN()
	}
	return b / c
}

func ratio(v, base *variant) float64 {
	b := base.opsPerSec()
	if b == 0 {
		return math.NaN()
	}
	return v.opsPerSec() / b
}

// ratioTarget records "v's throughput ≥ goal × base's".
func (r *report) ratioTarget(name, short string, v, base *variant, goal float64) {
	x := ratio(v, base)
	ok := x >= goal && v.errs == 0 && base.errs == 0
	r.targets = append(r.targets, target{name: name, short: short, got: fmt.Sprintf("%.3f×", x), want: fmt.Sprintf("≥ %.2g×", goal),
		value: x, goal: goal, ratio: true, pass: ok})
}

// maxTarget records "got ≤ limit"; got and want are the rendered figures.
func (r *report) maxTarget(name string, value, limit float64, got, want string) {
	r.targets = append(r.targets, target{name: name, got: got, want: want, pass: !math.IsNaN(value) && value <= limit})
}

// missing records a target that could not be measured in this run: a MISS
// that says why.
func (r *report) missing(name, want, why string) {
	r.targets = append(r.targets, target{name: name, got: "not measured: " + why, want: want})
}

// exactTarget records "got == want".
func (r *report) exactTarget(name string, got, want float64) {
	r.targets = append(r.targets, target{name: name, got: fmtF(got, 2), want: fmt.Sprintf("= %g", want),
		pass: !math.IsNaN(got) && math.Abs(got-want) < 0.005})
}

func (r *report) memTarget(m memRow) {
	r.targets = append(r.targets, target{
		name: fmt.Sprintf("memory, %s, %d B body", m.how, m.body),
		got:  fmtOverhead(m.overhead()) + " (plain SET of the body: " + fmtOverhead(m.baseline-float64(m.body)) + ")",
		want: "≤ body + 150 B",
		pass: m.overhead() <= 150,
	})
}

func fmtOverhead(x float64) string {
	if x < 0 {
		return fmt.Sprintf("body − %.0f B", -x)
	}
	return fmt.Sprintf("body + %.0f B", x)
}

func (r *report) race(clients int, effect time.Duration, naive, guarded *raceSide) {
	r.raceClients, r.raceEffect, r.naive, r.guarded = clients, effect, naive, guarded
	var b strings.Builder
	b.WriteString("| approach | keys | requests | side effects | duplicate effects | keys with duplicates | answered in progress (409) | replays | errors | wall time |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range []*raceSide{naive, guarded} {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | **%d** | %d | %d | %d | %d | %s |\n", s.name, s.keys, s.requests, s.effects,
			s.duplicates, s.dupKeys, s.busy, s.replays, s.errs, fmtDur(s.elapsed))
	}
	sec := r.section("4. Correctness under contention: naive check-then-insert vs idem",
		fmt.Sprintf("Each key is hit by %d goroutines released at once; the side effect takes %v (a sleep). "+
			"Naive: `GET`, and if absent run the effect and `SET`. idem: `idem.Do` (no WithWait, so a concurrent "+
			"duplicate is told 409/ErrInProgress at once). The two alternate key by key.", clients, effect))
	sec.body = b.String()
}

func machineInfo() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err == nil {
			mem = fmt.Sprintf(", %.1f GiB RAM", float64(kb)/(1<<20))
		}
	}
	kernel := ""
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = ", Linux " + strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("%s, %d logical CPUs (GOMAXPROCS %d)%s, %s/%s%s", cpu, runtime.NumCPU(), runtime.GOMAXPROCS(0), mem, runtime.GOOS, runtime.GOARCH, kernel)
}

func (r *report) markdown() string {
	var b strings.Builder
	c := r.cfg
	b.WriteString("# idem benchmark results\n\n")
	b.WriteString("Written by `go run .` in `bench/` (see README.md there for how to reproduce and what each scenario measures). ")
	b.WriteString("Every comparison runs the baseline and idem interleaved in short rounds, the order turned round by round (A B, then B A, …), in the same run, and every scenario starts on emptied servers (FLUSHALL, when the benchmark started them); ")
	b.WriteString("ops/s is the median over rounds, p50/p99 are over all operations, RT/op counts go-redis round trips ")
	b.WriteString("(a hook; pipelines count once), allocs/op is the process's `runtime.MemStats.Mallocs` delta divided by operations, ")
	b.WriteString("cli µs/op is this process's CPU time (user + system, getrusage) per operation, srv µs/op is redis-server's (user + system, from INFO cpu, so socket I/O included) for the standalone server: CPU cost vs baseline is (cli + srv of the baseline) / (cli + srv of the variant): the throughput ratio a purely CPU-bound machine would show, and steadier than throughput when other work shares the machine.\n\n")
	b.WriteString("| | |\n|---|---|\n")
	fmt.Fprintf(&b, "| date | %s (took %s) |\n", r.started.UTC().Format("2006-01-02 15:04 MST"), r.finished.Sub(r.started).Round(time.Second))
	fmt.Fprintf(&b, "| machine | %s |\n", machineInfo())
	fmt.Fprintf(&b, "| load average (1 min) | %s at start, %s at end (other work on the machine skews absolute numbers; the interleaving keeps ratios fair) |\n", r.loadStart, r.loadEnd)
	fmt.Fprintf(&b, "| Go | %s |\n", runtime.Version())
	fmt.Fprintf(&b, "| Redis | %s |\n", orNA(r.redisVersion))
	fmt.Fprintf(&b, "| PostgreSQL | %s |\n", orNA(r.pgVersion))
	mode := "full"
	if c.quick {
		mode = "**quick smoke run: numbers are noise**"
	}
	fmt.Fprintf(&b, "| settings | %s; %v measured per variant in %d rounds (+1 warm-up round); %d clients unless stated; "+
		"simulated delay %v; concurrency levels %v; contention: %d keys, effect %v; memory: %d records per kind; PostgreSQL synchronous_commit=%s |\n",
		mode, c.duration, c.rounds, c.clients, c.delay, c.levels, c.raceKeys, c.effect, c.memRecords, c.pgSync)
	if len(r.timings) > 0 {
		var ts []string
		for _, t := range r.timings {
			ts = append(ts, fmt.Sprintf("%s %s", t.name, t.took.Round(time.Second)))
		}
		fmt.Fprintf(&b, "| time per scenario | %s |\n", strings.Join(ts, ", "))
	}
	for _, n := range r.notes {
		fmt.Fprintf(&b, "| note | %s |\n", n)
	}
	b.WriteString("\n![chart](chart.png)\n\n## Targets\n\n| target | measured | wanted | result |\n|---|---:|---:|:---:|\n")
	for _, t := range r.targets {
		res := "PASS"
		if !t.pass {
			res = "**MISS**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", t.name, t.got, t.want, res)
	}
	b.WriteString(r.capacity())
	memDone := false // section 6 goes before the sections numbered after it
	for _, s := range r.sections {
		if !memDone && sectionNumber(s.title) > 6 {
			r.writeMem(&b)
			memDone = true
		}
		fmt.Fprintf(&b, "\n## %s\n\n%s\n", s.title, s.note)
		if len(s.pairs) > 0 {
			b.WriteString("\n| variant | clients | ops/s (median) | vs baseline | p50 | p99 | RT/op | allocs/op | cli µs/op | srv µs/op | CPU cost vs baseline | errors |\n")
			b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
			for pi, p := range s.pairs {
				for i, v := range p {
					if i == 0 && pi > 0 && p[0] == s.pairs[pi-1][0] {
						continue // same baseline as the row above
					}
					rel, cpu := "baseline", ""
					if i == 1 {
						rel = fmt.Sprintf("**%.2f×**", ratio(v, p[0]))
						if c := costRatio(p[0], v); !math.IsNaN(c) {
							cpu = fmt.Sprintf("%.2f×", c)
						}
					}
					fmt.Fprintf(&b, "| %s | %d | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %d |\n", v.name, v.clients, v.opsPerSec(), rel,
						fmtDur(v.lat.quantile(0.5)), fmtDur(v.lat.quantile(0.99)), fmtF(v.rtPerOp(), 2), fmtF(v.allocsPerOp(), 0),
						fmtF(v.cliUsecPerOp(), 1), fmtF(v.srvUsecPerOp(), 1), cpu, v.errs)
				}
			}
		}
		if s.body != "" {
			b.WriteString("\n" + s.body)
		}
	}
	if !memDone {
		r.writeMem(&b)
	}
	return b.String()
}

// writeMem writes section 6, the memory table, if the memory scenario ran.
func (r *report) writeMem(b *strings.Builder) {
	if len(r.mem) > 0 {
		b.WriteString("\n## 6. Memory: Redis bytes per completed record\n\n")
		fmt.Fprintf(b, "`MEMORY USAGE <key> SAMPLES 0` summed over every key a completed record leaves (record, and lease if any), "+
			"averaged over %d records per kind; body = the bytes the caller asked to store. The plain-SET column stores the body "+
			"alone under a key of the same length: Redis's own per-key floor, which includes jemalloc's size-class rounding "+
			"(a 10 KiB value occupies a 12 KiB allocation). Every kind uses a 4-letter key prefix, as long as the default \"idem\". "+
			"Text bodies are random alphanumerics (they deflate to about 3/4), random bytes do not compress.\n\n", r.cfg.memRecords)
		b.WriteString("| stored via | body | bytes per record | keys per record | overhead over body | plain SET of the body | idem beyond plain SET | target ≤ body + 150 B |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|:---:|\n")
		for _, m := range r.mem {
			res := "PASS"
			if m.overhead() > 150 {
				res = "**MISS**"
			}
			fmt.Fprintf(b, "| %s | %d | %.0f | %.1f | %.0f | %.0f | %+.0f | %s |\n", m.how, m.body, m.bytesPerRec, m.keysPerRecord, m.overhead(), m.baseline, m.bytesPerRec-m.baseline, res)
		}
	}
}

// sectionNumber returns the number a section title starts with (5 for
// "5b. …"), or 0.
func sectionNumber(title string) int {
	n := 0
	for _, c := range title {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}

func orNA(s string) string {
	if s == "" {
		return "not used"
	}
	return s
}

func (r *report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "RESULTS.md"), []byte(r.markdown()), 0o644); err != nil {
		return err
	}
	return r.chart(filepath.Join(dir, "chart.png"))
}
