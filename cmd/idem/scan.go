package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

var _ = register("scan", func(fs *flag.FlagSet) (func(context.Context, *env) error, bool) {
	prefix := fs.String("prefix", "idem", "key `prefix` of the store (idem.WithPrefix)")
	sample := fs.Int("sample", 1000, "records to sample; 0 scans every record")
	jsonOut := fs.Bool("json", false, "print one JSON object")
	return func(ctx context.Context, e *env) error { return scan(ctx, e, *prefix, *sample, *jsonOut) }, false
})

// scanCount is the COUNT hint of each SCAN call: keys the server examines
// per call, small enough not to stall it.
const scanCount = 500

// scanReport is the output of scan -json.
type scanReport struct {
	Target   string         `json:"target"`
	Prefix   string         `json:"prefix"`
	Servers  int            `json:"servers"`  // masters scanned
	DBKeys   int64          `json:"db_keys"`  // DBSIZE summed over them: every key, idem's or not
	Sampled  int            `json:"sampled"`  // records read
	Complete bool           `json:"complete"` // the scan covered every record: the counts are totals
	States   map[string]int `json:"states"`   // completed, in_progress, released, unreadable
	Memory   *distribution  `json:"memory_bytes,omitempty"`
	TTL      *distribution  `json:"ttl_seconds,omitempty"`
	NoTTL    int            `json:"no_ttl"` // records without a TTL: never written by idem
	Buckets  []ttlBucket    `json:"ttl_buckets,omitempty"`
}

// distribution summarises sampled values.
type distribution struct {
	Min   float64 `json:"min"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
	Mean  float64 `json:"mean"`
	Total float64 `json:"total"` // over the records read
}

type ttlBucket struct {
	Below   string `json:"below"` // "" for the last bucket
	Records int    `json:"records"`
}

// sample is what scan learns of one record.
type sample struct {
	state string
	mem   int64
	ttl   time.Duration // -1: no TTL
}

// scan samples the records under prefix on every master.
func scan(ctx context.Context, e *env, prefix string, limit int, jsonOut bool) error {
	if limit < 0 {
		return usageError(e, "-sample must be 0 (every record) or more")
	}
	if len(e.args) > 0 {
		return usageError(e, fmt.Sprintf("scan takes no arguments, got %q", e.args))
	}
	var (
		mu       sync.Mutex
		samples  []sample
		complete = true
		rep      = &scanReport{Target: e.target, Prefix: prefix, States: map[string]int{}}
	)
	masters := 1
	if cc, ok := e.client.(*redis.ClusterClient); ok {
		var n atomic.Int64
		if err := cc.ForEachMaster(ctx, func(context.Context, *redis.Client) error { n.Add(1); return nil }); err != nil {
			return err
		}
		masters = max(int(n.Load()), 1)
	}
	quota := 0
	if limit > 0 {
		quota = (limit + masters - 1) / masters
	}
	pattern := globEscape(prefix) + ":{*}"
	err := forEachServer(ctx, e, func(ctx context.Context, c *redis.Client, name string) error {
		s, done, err := scanServer(ctx, c, pattern, quota)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		n, err := c.DBSize(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		mu.Lock()
		defer mu.Unlock()
		samples, complete = append(samples, s...), complete && done
		rep.Servers++
		rep.DBKeys += n
		return nil
	})
	if err != nil {
		return explainNoPerm(err)
	}
	rep.summarise(samples, complete)
	if jsonOut {
		return json.NewEncoder(e.stdout).Encode(rep)
	}
	rep.print(e.stdout)
	return nil
}

// explainNoPerm adds to a refusal by the server's ACLs which user scan
// needs: the application's own user may not run SCAN, DBSIZE or MEMORY
// USAGE.
func explainNoPerm(err error) error {
	var r redis.Error
	if errors.As(err, &r) && strings.HasPrefix(r.Error(), "NOPERM") {
		return fmt.Errorf("%w (scan needs SCAN, DBSIZE, GETRANGE and MEMORY USAGE, which the application's user lacks: "+
			"run it as the idem-ops user of docs/operations.md, \"Least privilege\")", err)
	}
	return err
}

// forEachServer calls fn on the server of a single or failover client, or
// on every master of a cluster, concurrently; name is the server's address,
// or the target of a failover client.
func forEachServer(ctx context.Context, e *env, fn func(ctx context.Context, c *redis.Client, name string) error) error {
	switch c := e.client.(type) {
	case *redis.Client:
		name := c.Options().Addr
		if c.Options().Addr == "FailoverClient" { // go-redis's placeholder
			name = e.target
		}
		return fn(ctx, c, name)
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return fn(ctx, c, c.Options().Addr) })
	}
	return fmt.Errorf("unsupported client %T", e.client)
}

// scanServer reads up to quota records (0: all) matching pattern. done
// reports whether it saw every one.
func scanServer(ctx context.Context, c *redis.Client, pattern string, quota int) (out []sample, done bool, err error) {
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, pattern, scanCount).Result()
		if err != nil {
			return nil, false, err
		}
		cut := quota > 0 && len(out)+len(keys) > quota
		if cut {
			keys = keys[:quota-len(out)]
		}
		s, err := sampleKeys(ctx, c, keys)
		if err != nil {
			return nil, false, err
		}
		out, cursor = append(out, s...), next
		switch {
		case cut || (quota > 0 && len(out) >= quota && cursor != 0):
			return out, false, nil
		case cursor == 0:
			return out, true, nil
		}
	}
}

// sampleKeys reads the head, TTL and memory of records, and their leases'
// TTL, in one pipeline.
func sampleKeys(ctx context.Context, c *redis.Client, keys []string) ([]sample, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	type cmds struct {
		head      *redis.StringCmd
		ttl, lttl *redis.DurationCmd
		mem       *redis.IntCmd
	}
	cs := make([]cmds, len(keys))
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cs[i] = cmds{p.GetRange(ctx, k, 0, 1), p.PTTL(ctx, k), p.PTTL(ctx, k+":l"), p.MemoryUsage(ctx, k, 0)}
		}
		return nil
	})
	var replyErr redis.Error
	if err != nil && !errors.As(err, &replyErr) && !errors.Is(err, redis.Nil) {
		return nil, err // the connection, not one key
	}
	out := make([]sample, 0, len(keys))
	for _, c := range cs {
		s := sample{mem: c.mem.Val(), ttl: c.ttl.Val()}
		lease := c.lttl.Val()
		switch head := c.head.Val(); {
		case c.head.Err() != nil || c.ttl.Val() == -2:
			if c.ttl.Val() == -2 {
				continue // expired since SCAN listed it
			}
			s.state = "unreadable"
		case head == "1C":
			s.state = "completed"
		case head == "1P" && (lease > 0 || lease == -1):
			s.state = "in_progress"
		case head == "1P":
			s.state = "released"
		default:
			s.state = "unreadable"
		}
		out = append(out, s)
	}
	return out, nil
}

// globEscape escapes the characters that SCAN's MATCH reads as a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// ttlBounds are the upper bounds of the TTL buckets.
var ttlBounds = []time.Duration{time.Minute, time.Hour, 6 * time.Hour, 24 * time.Hour}

// summarise fills the report from the samples.
func (r *scanReport) summarise(samples []sample, complete bool) {
	r.Sampled, r.Complete = len(samples), complete
	var mem, ttl []float64
	counts := make([]int, len(ttlBounds)+1)
	for _, s := range samples {
		r.States[s.state]++
		mem = append(mem, float64(s.mem))
		if s.ttl < 0 {
			r.NoTTL++
			continue
		}
		ttl = append(ttl, s.ttl.Seconds())
		i, _ := slices.BinarySearch(ttlBounds, s.ttl+1)
		counts[i]++
	}
	r.Memory, r.TTL = distribute(mem), distribute(ttl)
	if len(ttl) > 0 {
		for i, n := range counts {
			b := ttlBucket{Records: n}
			if i < len(ttlBounds) {
				b.Below = shortDuration(ttlBounds[i])
			}
			r.Buckets = append(r.Buckets, b)
		}
	}
}

func distribute(v []float64) *distribution {
	if len(v) == 0 {
		return nil
	}
	slices.Sort(v)
	at := func(q float64) float64 { return v[min(int(q*float64(len(v))), len(v)-1)] }
	d := &distribution{Min: v[0], P50: at(0.5), P90: at(0.9), P99: at(0.99), Max: v[len(v)-1]}
	for _, x := range v {
		d.Total += x
	}
	d.Mean = d.Total / float64(len(v))
	for _, f := range []*float64{&d.Min, &d.P50, &d.P90, &d.P99, &d.Max, &d.Mean, &d.Total} {
		*f = math.Round(*f*1000) / 1000 // milliseconds of TTL; bytes
	}
	return d
}

// print prints the report for people.
func (r *scanReport) print(w io.Writer) {
	fmt.Fprintf(w, "%s: prefix %q, %d server(s), %d keys in all\n", r.Target, r.Prefix, r.Servers, r.DBKeys)
	if r.Sampled == 0 {
		fmt.Fprintf(w, "no records under prefix %q\n", r.Prefix)
		return
	}
	how := "every record: the counts are totals"
	if !r.Complete {
		how = "a sample: the scan stopped there (-sample 0 reads every record)"
	}
	fmt.Fprintf(w, "%-16s %d (%s)\n", "records read", r.Sampled, how)
	notes := map[string]string{"in_progress": "held by a live lease: running", "released": "not held: the next request takes over",
		"unreadable": "not an idem record of a format this version reads"}
	for _, st := range []string{"completed", "in_progress", "released", "unreadable"} {
		n := r.States[st]
		line := fmt.Sprintf("  %-14s %6d %6.1f%%  %s", st, n, 100*float64(n)/float64(r.Sampled), notes[st])
		fmt.Fprintln(w, strings.TrimRight(line, " "))
	}
	m := r.Memory
	fmt.Fprintf(w, "%-16s min %s  p50 %s  p90 %s  p99 %s  max %s  mean %s  (sum %s)\n", "memory/record",
		bytesText(m.Min), bytesText(m.P50), bytesText(m.P90), bytesText(m.P99), bytesText(m.Max), bytesText(m.Mean), bytesText(m.Total))
	if t := r.TTL; t != nil {
		sec := func(s float64) string { return shortDuration(time.Duration(s * float64(time.Second))) }
		fmt.Fprintf(w, "%-16s min %s  p50 %s  p90 %s  max %s\n", "record TTL", sec(t.Min), sec(t.P50), sec(t.P90), sec(t.Max))
		fmt.Fprintf(w, "%-16s", "TTL buckets")
		for _, b := range r.Buckets {
			if b.Below == "" {
				fmt.Fprintf(w, "  >=%s %d", r.Buckets[len(r.Buckets)-2].Below, b.Records)
			} else {
				fmt.Fprintf(w, "  <%s %d", b.Below, b.Records)
			}
		}
		fmt.Fprintln(w)
	}
	if r.NoTTL > 0 {
		fmt.Fprintf(w, "warning: %d record(s) without a TTL: idem never writes one; something else wrote under prefix %q\n", r.NoTTL, r.Prefix)
	}
}

func bytesText(b float64) string {
	switch {
	case b >= 10<<20:
		return fmt.Sprintf("%.0f MiB", b/(1<<20))
	case b >= 10<<10:
		return fmt.Sprintf("%.0f KiB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}

// shortDuration prints 24h rather than 24h0m0s.
func shortDuration(d time.Duration) string {
	s := d.Round(time.Second).String()
	s = strings.TrimSuffix(s, "0s")
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	if s == "" {
		s = "0s"
	}
	return s
}
