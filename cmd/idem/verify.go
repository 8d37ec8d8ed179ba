package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest/verify"
	"github.com/idemkit/idem/internal/redisauth"
)

var _ = register("verify", func(fs *flag.FlagSet) (func(context.Context, *env) error, bool) {
	v := registerVerifyFlags(fs)
	return func(ctx context.Context, e *env) error { return verifyCmd(ctx, e, v) }, true
})

// The workload's timing: a lease short enough that a key abandoned by a
// failed write is free again soon, and a wait for concurrent duplicates.
const (
	verifyLease = 2 * time.Second
	verifyWait  = time.Second
)

// verifyFlags are the options of idem verify.
type verifyFlags struct {
	duration   time.Duration
	workers    int
	keys       int
	payload    int
	rate       int
	replicaAck int
	prefix     string
	jsonOut    bool
}

func registerVerifyFlags(fs *flag.FlagSet) *verifyFlags {
	v := &verifyFlags{}
	fs.DurationVar(&v.duration, "duration", 30*time.Second, "how long to run the workload")
	fs.IntVar(&v.workers, "workers", 16, "concurrent clients")
	fs.IntVar(&v.keys, "keys", 1000, "distinct keys at most")
	fs.IntVar(&v.payload, "payload", 256, "`BYTES` of each stored result")
	fs.IntVar(&v.rate, "rate", 1000, "calls per second at most, over all workers (the final probes are not paced)")
	fs.StringVar(&v.prefix, "prefix", "idem", "the application's key `prefix` (idem.WithPrefix): verify writes under P:verify-RANDOM, which its ACL pattern ~P:* covers")
	fs.IntVar(&v.replicaAck, "replica-ack", 0, "replicas that must acknowledge each write (idem.WithReplicaAck); 0: none")
	fs.BoolVar(&v.jsonOut, "json", false, "print the figures as one JSON object on the last line")
	return v
}

// validate reports a usage error in the flags.
func (v *verifyFlags) validate(e *env) error {
	switch {
	case len(e.args) > 0:
		return usageError(e, fmt.Sprintf("verify takes no arguments, got %q", e.args))
	case v.duration <= 0:
		return usageError(e, "-duration must be positive")
	case v.workers < 1 || v.workers > 1024:
		return usageError(e, "-workers must be between 1 and 1024")
	case v.keys < 1 || v.keys > 1_000_000:
		return usageError(e, "-keys must be between 1 and 1000000")
	case v.payload < 0 || v.payload > 1<<20:
		return usageError(e, "-payload must be between 0 and 1048576")
	case v.rate < 1:
		return usageError(e, "-rate must be positive")
	case v.replicaAck < 0:
		return usageError(e, "-replica-ack must not be negative")
	case v.prefix == "":
		return usageError(e, "-prefix must not be empty")
	case strings.ContainsAny(v.prefix, "{}"):
		return usageError(e, "-prefix must not contain { or }")
	}
	return nil
}

// verifyRun is one run of idem verify.
type verifyRun struct {
	e       *env
	f       *verifyFlags
	prefix  string
	timeout time.Duration
	out     io.Writer // progress and the verdict in words
}

// verifyCmd runs the workload against the server, checks the history and
// prints the verdict.
func verifyCmd(ctx context.Context, e *env, f *verifyFlags) error {
	if err := f.validate(e); err != nil {
		return err
	}
	r := &verifyRun{e: e, f: f, prefix: f.prefix + ":verify-" + randomHex(), timeout: e.timeout, out: e.stdout}
	if f.jsonOut {
		r.out = e.stderr
	}
	if r.timeout <= 0 {
		r.timeout = 10 * time.Second
	}
	store := idem.NewRedisStore(e.client, idem.WithPrefix(r.prefix),
		idem.WithReplicaAck(f.replicaAck, min(time.Second, r.timeout)),
		idem.WithStoreLogger(slog.New(slog.DiscardHandler)))
	before, err := r.setup(ctx, store)
	if err != nil {
		return err
	}
	h := verify.NewHistory()
	w := r.workload(store)
	r.run(ctx, w, h, store)
	limits(ctx, e, r.timeout, h, before, f.replicaAck > 0)
	cleanup(e, r.prefix, r.timeout, f.duration+time.Minute, r.out)
	rep := verify.Check(h)
	r.print(rep, w, h)
	if ctx.Err() != nil {
		return errors.New("interrupted: the run is incomplete")
	}
	if !rep.OK() {
		return fmt.Errorf("%d invariant violation(s) on %s", rep.Total(), e.target)
	}
	return nil
}

// setup checks that the server can be used and reads what limits detects
// changes of.
func (r *verifyRun) setup(ctx context.Context, store *idem.RedisStore) (serverState, error) {
	cctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	if err := store.Check(cctx); err != nil {
		var auth *redisauth.Error
		if errors.As(err, &auth) {
			return serverState{}, auth // it names the server
		}
		return serverState{}, fmt.Errorf("%s cannot be used: %w", r.e.target, err)
	}
	st := readState(cctx, r.e)
	fmt.Fprintf(r.out, "idem verify: %s, prefix %s, %v, %d workers, %d keys, %d-byte results, replica acks %d\n",
		r.e.target, r.prefix, r.f.duration, r.f.workers, r.f.keys, r.f.payload, r.f.replicaAck)
	return st, nil
}

// workload returns the workload of the run: two Guards on the store, as two
// replicas of an application.
func (r *verifyRun) workload(store *idem.RedisStore) *verify.Workload {
	quiet := idem.WithLogger(slog.New(slog.DiscardHandler))
	retention := idem.WithRetention(r.f.duration + verifyLease + verifyWait + time.Minute)
	var gs []*idem.Guard
	for range 2 {
		gs = append(gs, idem.New(store, quiet, retention, idem.WithLease(verifyLease), idem.WithWait(verifyWait)))
	}
	var seed [8]byte
	_, _ = rand.Read(seed[:])
	return &verify.Workload{
		Guards: gs, Workers: r.f.workers, Keys: r.f.keys, KeyPrefix: "k", Payload: r.f.payload,
		Rate: r.f.rate, Timeout: r.timeout + verifyLease + verifyWait,
		Seed: uint64(seed[0]) | uint64(seed[1])<<8 | uint64(seed[2])<<16 | uint64(seed[3])<<24,
	}
}

// run runs the workload for the duration, printing progress, then probes
// every key it used.
func (r *verifyRun) run(ctx context.Context, w *verify.Workload, h *verify.History, store *idem.RedisStore) {
	wctx, cancel := context.WithTimeout(ctx, r.f.duration)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(wctx, h, verify.NewSink(h))
	}()
	tick := time.NewTicker(progressEvery(r.f.duration))
	defer tick.Stop()
	for running := true; running; {
		select {
		case <-done:
			running = false
		case <-tick.C:
			fmt.Fprintf(r.out, "progress: %v, %d operations, %d keys\n", h.Now().Round(time.Second), w.Calls(), w.KeysUsed())
		}
	}
	probe := idem.New(store, idem.WithLogger(slog.New(slog.DiscardHandler)),
		idem.WithLease(verifyLease), idem.WithWait(verifyLease+verifyWait))
	w.Probe(ctx, probe, h, verify.NewSink(h))
}

// progressEvery returns how often run prints progress: about ten times.
func progressEvery(d time.Duration) time.Duration {
	return max(d/10, time.Second)
}

// randomHex returns 8 random hexadecimal digits.
func randomHex() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// verdict is the JSON object of -json.
type verdict struct {
	Operations int            `json:"operations"`
	Probes     int            `json:"probes"`
	Effects    int            `json:"effects"`
	Duplicates int            `json:"duplicates"`
	Lost       int            `json:"lost"`
	Divergent  int            `json:"divergent"`
	FailClosed int            `json:"fail_closed"`
	Stuck      int            `json:"stuck"`
	Violations int            `json:"violations"`
	FromLimits int            `json:"from_limits"`
	Errors     map[string]int `json:"errors"`
	P50Ms      float64        `json:"p50_ms"`
	P99Ms      float64        `json:"p99_ms"`
	Prefix     string         `json:"prefix"`
	Faults     []string       `json:"faults"`
	Details    []string       `json:"details"` // the first violations
}

// print writes the verdict, in words and, with -json, as one JSON object.
func (r *verifyRun) print(rep *verify.Report, w *verify.Workload, h *verify.History) {
	v := verdict{
		Operations: rep.Operations, Probes: rep.Probes, Effects: rep.Effects,
		Duplicates: rep.Duplicates, Lost: rep.Lost, Divergent: rep.Divergent, FailClosed: rep.FailClosed,
		Stuck: rep.Stuck, Violations: rep.Total(), FromLimits: rep.FromLimits, Errors: map[string]int{},
		P50Ms: millis(rep.P50), P99Ms: millis(rep.P99), Prefix: r.prefix, Faults: []string{}, Details: []string{},
	}
	for _, f := range h.Faults() {
		v.Faults = append(v.Faults, f.Name)
		fmt.Fprintf(r.out, "fault: %s\n", f.Name)
	}
	for k, n := range rep.Errors {
		v.Errors[string(k)] = n
	}
	for _, x := range rep.Violations[:min(len(rep.Violations), 10)] {
		v.Details = append(v.Details, x.String())
	}
	o := r.out
	fmt.Fprintf(o, "operations   %d (%d keys; %d probes; fn ran %d times; %d effects, %d fenced off)\n",
		rep.Operations, w.KeysUsed(), rep.Probes, rep.Ran, rep.Effects, rep.Fenced)
	fmt.Fprintf(o, "duplicates   %d   effects accepted twice for one key (I1)\n", rep.Duplicates)
	fmt.Fprintf(o, "lost         %d   results handed out, then run again (I3)\n", rep.Lost)
	fmt.Fprintf(o, "divergent    %d   repeats that got another result (I2)\n", rep.Divergent)
	fmt.Fprintf(o, "fail-closed  %d   fail-closed errors after fn ran (I2)\n", rep.FailClosed)
	fmt.Fprintf(o, "stuck        %d   keys neither completed nor free at the end (I4)\n", rep.Stuck)
	printErrors(o, v.Errors)
	fmt.Fprintf(o, "latency      p50 %v, p99 %v\n", rep.P50.Round(10*time.Microsecond), rep.P99.Round(10*time.Microsecond))
	for i, d := range v.Details {
		if i == 10 {
			fmt.Fprintf(o, "... and %d more\n", rep.Total()-10)
			break
		}
		fmt.Fprintf(o, "violation: %s\n", d)
	}
	if rep.OK() {
		fmt.Fprintf(o, "verdict: ok, no invariant violated in %d operations\n", rep.Operations)
	} else {
		fmt.Fprintf(o, "verdict: FAILED, %d violation(s) (%d during a documented limit)\n", rep.Total(), rep.FromLimits)
	}
	if r.f.jsonOut {
		b, _ := json.Marshal(v)
		fmt.Fprintf(r.e.stdout, "%s\n", b)
	}
}

// errorMeanings says what each kind of error of the workload means.
var errorMeanings = map[string]string{
	"canceled":                "calls cut short when -duration ran out (or by an interrupt, or past -timeout): the caller gave up, as a client does",
	"failed":                  "the workload's own transient failures, which release the key for a retry",
	"mismatch":                "keys the workload reuses on purpose with another request",
	"permanent":               "errors the workload stores on purpose (idem.Permanent), replayed to repeats",
	"in_progress":             "duplicates that found the key still running after waiting",
	"store_unavailable":       "Redis did not answer in time or refused a write; the function did not run",
	"not_recorded":            "the function ran but Redis did not store its result: the next attempt runs with fence + 1",
	"not_recorded_lease_lost": "the function ran past its lease and its result was not stored: the next attempt runs with fence + 1",
	"lease_lost":              "the lease was lost before anything was stored",
	"unreadable":              "a stored result could not be read",
	"invalid_key":             "a key idem refused",
}

// printErrors writes the outcomes other than ok by kind, then what each
// kind present means.
func printErrors(w io.Writer, m map[string]int) {
	if len(m) == 0 {
		fmt.Fprintf(w, "errors       none\n")
		return
	}
	var parts []string
	kinds := slices.Sorted(maps.Keys(m))
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	fmt.Fprintf(w, "errors       %s\n", strings.Join(parts, ", "))
	for _, k := range kinds {
		if why, ok := errorMeanings[k]; ok {
			fmt.Fprintf(w, "             %s: %s\n", k, why)
		}
	}
	fmt.Fprintf(w, "             (what callers got instead of a result: not violations in themselves; violations are the lines above)\n")
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
