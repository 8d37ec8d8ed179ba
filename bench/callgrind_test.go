package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// TestRedisInstructions counts the instructions redis-server runs per
// operation, under valgrind's callgrind: a measure of the server's CPU that
// does not move with the machine's load, as INFO cpu does. One client sends
// N, then 2N operations of each workload one after the other; the counts of
// the two runs are taken apart (callgrind_control -z, then -d) and their
// difference divided by N, so that what a run costs once (its warm-up, the
// first connection) cancels. The server's cron is left out of the counts
// (--toggle-collect=serverCron); its keyspace is filled beforehand past the
// size where the dictionaries grow, so that no run pays for a rehash.
//
// Counted: the server's user-space instructions, which is what idem's
// scripts change; not counted: the kernel's share of a round trip (the
// read, the write and the wake-up), the same for a script and a plain
// command, and most of what INFO cpu adds up on loopback. Opt in, it takes
// about a minute:
//
//	IDEM_CALLGRIND=1 go test -run TestRedisInstructions -v .
//
// IDEM_CALLGRIND_OPS sets N (default 1000), IDEM_CALLGRIND_TOP=n lists each
// workload's n costliest functions (self cost, per operation).
func TestRedisInstructions(t *testing.T) {
	if os.Getenv("IDEM_CALLGRIND") == "" {
		t.Skip("set IDEM_CALLGRIND=1 to count redis-server's instructions under valgrind")
	}
	for _, bin := range []string{"valgrind", "callgrind_control", "redis-server"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not on PATH", bin)
		}
	}
	n, top := envInt("IDEM_CALLGRIND_OPS", 1000), envInt("IDEM_CALLGRIND_TOP", 0)
	ctx := context.Background()
	vg := startCallgrind(t)
	// A server under valgrind is slow: the keyspace's setup takes minutes
	// on a loaded machine, and a command is never sent twice.
	c := redis.NewClient(&redis.Options{Addr: vg.addr, PoolSize: 1, ContextTimeoutEnabled: true, MaxRetries: -1,
		ReadTimeout: 10 * time.Minute, WriteTimeout: time.Minute, DialTimeout: time.Minute})
	t.Cleanup(func() { _ = c.Close() })
	// Past 262144 keys the dictionaries are sized for 524288, which the
	// runs do not reach.
	if err := c.Do(ctx, "DEBUG", "POPULATE", 270000, "pad", 10).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Eval(ctx, "for i = 0, 269999 do redis.call('PEXPIRE', 'pad:' .. i, 36000000) end return 1", nil).Err(); err != nil {
		t.Fatal(err)
	}
	for rehashing(ctx, t, c) {
		time.Sleep(time.Second) // the cron finishes the rehash at its own pace
	}

	// A server under valgrind answers in milliseconds, not microseconds:
	// budgets that a loaded machine does not run out.
	// No key expires during the runs (a run under valgrind takes minutes):
	// an expiry would land in the counts of whatever runs then.
	const ttl = time.Hour
	g := idem.New(idem.NewRedisStore(c, idem.WithPrefix("cg")), idem.WithRetention(ttl),
		idem.WithStoreTimeout(time.Minute), idem.WithWriteTimeout(time.Minute))
	fn := func(context.Context, *idem.Attempt) (payment, error) { return thePayment, nil }
	const replayKeys = 16
	for i := range replayKeys {
		if err := c.Set(ctx, "raw:{get-"+strconv.Itoa(i)+"}", rawPayload, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := idem.Do(ctx, g, "replay-"+strconv.Itoa(i), theReq, fn); err != nil {
			t.Fatal(err)
		}
	}
	retMs := ttl.Milliseconds()
	workloads := []struct {
		name, floor string
		op          func(i int) error
	}{
		{"raw SET NX PX + SET PX", "", func(i int) error {
			k := "raw:{f-" + strconv.Itoa(i) + "}"
			if err := c.SetNX(ctx, k+":l", "owner-token-0123456", ttl).Err(); err != nil {
				return err
			}
			return c.Set(ctx, k, rawPayload, ttl).Err()
		}},
		{"minimal Lua claim + complete", "raw SET NX PX + SET PX", func(i int) error {
			k := "lua:{f-" + strconv.Itoa(i) + "}"
			ks := []string{k, k + ":l"}
			if err := luaClaim.Run(ctx, c, ks, "owner-token-0123456", retMs, retMs).Err(); err != nil {
				return err
			}
			return luaComplete.Run(ctx, c, ks, rawPayload, retMs).Err()
		}},
		{"idem.Do, fresh key", "raw SET NX PX + SET PX", func(i int) error {
			_, err := idem.Do(ctx, g, "fresh-"+strconv.Itoa(i), theReq, fn)
			return err
		}},
		{"raw GET", "", func(i int) error {
			return c.Get(ctx, "raw:{get-"+strconv.Itoa(i%replayKeys)+"}").Err()
		}},
		{"minimal Lua read", "raw GET", func(i int) error {
			return luaRead.Run(ctx, c, []string{"raw:{get-" + strconv.Itoa(i%replayKeys) + "}"}).Err()
		}},
		{"idem.Do, replay", "raw GET", func(i int) error {
			_, err := idem.Do(ctx, g, "replay-"+strconv.Itoa(i%replayKeys), theReq, fn)
			return err
		}},
	}
	seq := 0
	per := map[string]float64{}
	for _, w := range workloads {
		run := func(k int) (int64, map[string]int64) {
			vg.control(t, "-z")
			for range k {
				seq++
				if err := w.op(seq); err != nil {
					t.Fatalf("%s: %v", w.name, err)
				}
			}
			return vg.dump(t)
		}
		for range 20 { // scripts loaded, connection made
			seq++
			if err := w.op(seq); err != nil {
				t.Fatalf("%s: %v", w.name, err)
			}
		}
		a, fa := run(n)
		b, fb := run(2 * n)
		per[w.name] = float64(b-a) / float64(n)
		line := fmt.Sprintf("%-30s %8.0f instructions/op", w.name, per[w.name])
		if w.floor != "" {
			line += fmt.Sprintf("  %.2f× %s", per[w.name]/per[w.floor], w.floor)
		}
		t.Log(line)
		if top > 0 {
			type fnCost struct {
				name string
				ir   float64
			}
			var costs []fnCost
			var unnamed int64 // static functions, which the stripped binary does not name: under a script, mostly Lua's
			for name, ir := range fb {
				if strings.HasPrefix(name, "0x") {
					unnamed += ir - fa[name]
					continue
				}
				costs = append(costs, fnCost{name, float64(ir-fa[name]) / float64(n)})
			}
			if unnamed > 0 {
				costs = append(costs, fnCost{"(static functions, unnamed; under a script mostly the Lua interpreter's)", float64(unnamed) / float64(n)})
			}
			slices.SortFunc(costs, func(x, y fnCost) int { return int(y.ir - x.ir) })
			for _, f := range costs[:min(top, len(costs))] {
				t.Logf("    %7.0f  %s", f.ir, f.name)
			}
		}
	}
}

// callgrind is a redis-server running under valgrind's callgrind.
type callgrind struct {
	addr, dir string
	pid       int
}

// startCallgrind starts redis-server under callgrind on a free loopback
// port, stopped by t.Cleanup.
func startCallgrind(t *testing.T) *callgrind {
	t.Helper()
	port, err := freePort(false)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command("valgrind", "--tool=callgrind", "--toggle-collect=serverCron", "--collect-atstart=yes",
		"--dump-instr=no", "--callgrind-out-file="+filepath.Join(dir, "cg.out"),
		"redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--enable-debug-command", "local")
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopProc(cmd) })
	vg := &callgrind{addr: "127.0.0.1:" + strconv.Itoa(port), dir: dir, pid: cmd.Process.Pid}
	for start := time.Now(); ; {
		if conn, err := net.Dial("tcp", vg.addr); err == nil {
			conn.Close()
			break
		}
		if time.Since(start) > time.Minute {
			t.Fatal("redis-server under valgrind did not answer within a minute")
		}
		time.Sleep(100 * time.Millisecond) // polling a process starting under valgrind: nothing to wait on
	}
	return vg
}

func (vg *callgrind) control(t *testing.T, flag string) {
	t.Helper()
	if out, err := exec.Command("callgrind_control", flag, strconv.Itoa(vg.pid)).CombinedOutput(); err != nil {
		t.Fatalf("callgrind_control %s: %v\n%s", flag, err, out)
	}
}

// dump writes the counts since the last zeroing and returns their total and
// the self cost of each function.
func (vg *callgrind) dump(t *testing.T) (int64, map[string]int64) {
	t.Helper()
	before, _ := filepath.Glob(filepath.Join(vg.dir, "cg.out.*"))
	vg.control(t, "-d") // returns once the dump is written
	after, _ := filepath.Glob(filepath.Join(vg.dir, "cg.out.*"))
	var file string
	for _, f := range after {
		if !slices.Contains(before, f) {
			file = f
		}
	}
	if file == "" {
		t.Fatal("callgrind wrote no dump")
	}
	fh, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	return parseCallgrind(t, fh)
}

// parseCallgrind reads a callgrind dump (one event, Ir): the total and the
// self cost per function. Names are compressed ("(id) name" once, "(id)"
// after); the line after a calls= line is the call's inclusive cost, not
// the caller's own.
func parseCallgrind(t *testing.T, f *os.File) (int64, map[string]int64) {
	var total int64
	self := map[string]int64{}
	names := map[string]string{}
	name := func(s string) string {
		if !strings.HasPrefix(s, "(") {
			return s
		}
		id, rest, _ := strings.Cut(s, ")")
		if rest = strings.TrimSpace(rest); rest != "" {
			names[id] = rest
		}
		return names[id]
	}
	cur, inCall := "", false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "summary:"), strings.HasPrefix(l, "totals:"):
			total, _ = strconv.ParseInt(strings.Fields(l)[1], 10, 64)
		case strings.HasPrefix(l, "fn="):
			cur = name(l[3:])
		case strings.HasPrefix(l, "cfn="):
			name(l[4:])
		case strings.HasPrefix(l, "calls="):
			inCall = true
		case l != "" && (l[0] >= '0' && l[0] <= '9' || l[0] == '+' || l[0] == '-' || l[0] == '*'):
			if inCall {
				inCall = false
				continue
			}
			if fs := strings.Fields(l); len(fs) >= 2 {
				v, _ := strconv.ParseInt(fs[1], 10, 64)
				self[cur] += v
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return total, self
}

// rehashing reports whether a dictionary of database 0 is being rehashed.
func rehashing(ctx context.Context, t *testing.T, c *redis.Client) bool {
	s, err := c.Do(ctx, "DEBUG", "HTSTATS", 0).Text()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(s, "rehashing target")
}
