package main

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// Scenario 9, "notify": a duplicate waiting under idem.WithWait is woken by
// a notification (SPUBLISH from complete.lua and release.lua, one shared
// SSUBSCRIBE connection per Guard and node) instead of polling. On the
// standalone redis-server: the wake-up lag after a completion, the commands
// a waiter sends while it waits, and the Redis CPU the notification adds to
// a fresh operation when nobody waits.

// cmdCounter is a go-redis hook that counts, by name, the commands a client
// writes on every connection it opens — pooled and Pub/Sub alike, which a
// ProcessHook would not see (SSUBSCRIBE goes straight to the Pub/Sub
// connection) — by reading the RESP it sends.
type cmdCounter struct {
	mu    sync.Mutex
	names map[string]int
}

func (c *cmdCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		cn, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: cn, p: respCounter{c: c}}, nil
	}
}

func (c *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (c *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (c *cmdCounter) add(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.names == nil {
		c.names = map[string]int{}
	}
	c.names[name]++
}

func (c *cmdCounter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.names)
}

// since returns the commands counted since snapshot s.
func (c *cmdCounter) since(s map[string]int) map[string]int {
	d := map[string]int{}
	for k, v := range c.snapshot() {
		if v > s[k] {
			d[k] = v - s[k]
		}
	}
	return d
}

// countingConn passes writes through respCounter on their way out.
type countingConn struct {
	net.Conn
	p respCounter
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.p.feed(b)
	return c.Conn.Write(b)
}

// respCounter parses the commands a client writes (RESP arrays of bulk
// strings, however the writes split them) and counts each by its name.
type respCounter struct {
	c           *cmdCounter
	line        []byte // header line being read ("*3", "$7")
	inBulk      bool
	args        int // bulk strings left in the current command
	contentLeft int // bytes of the current bulk string left
	crlfLeft    int
	first       bool // the current bulk string is the command's name
	name        []byte
}

func (p *respCounter) feed(b []byte) {
	for _, ch := range b {
		if !p.inBulk {
			if ch != '\n' {
				p.line = append(p.line, ch)
				continue
			}
			l := strings.TrimSuffix(string(p.line), "\r")
			p.line = p.line[:0]
			var n int
			switch {
			case strings.HasPrefix(l, "*"):
				if _, err := fmt.Sscan(l[1:], &n); err == nil && n > 0 {
					p.args, p.first, p.name = n, true, p.name[:0]
				}
			case strings.HasPrefix(l, "$"):
				if _, err := fmt.Sscan(l[1:], &n); err == nil && n >= 0 {
					p.inBulk, p.contentLeft, p.crlfLeft = true, n, 2
				}
			}
			continue
		}
		if p.contentLeft > 0 {
			p.contentLeft--
			if p.first && len(p.name) < 32 {
				p.name = append(p.name, ch)
			}
			continue
		}
		if p.crlfLeft--; p.crlfLeft > 0 {
			continue
		}
		p.inBulk, p.first = false, false
		if p.args--; p.args == 0 {
			p.c.add(strings.ToUpper(string(p.name)))
		}
	}
}

// handshake reports whether name is part of go-redis's connection set-up
// (HELLO, CLIENT SETINFO), sent once per new connection, not by the waiter.
func handshake(name string) bool { return name == "HELLO" || name == "CLIENT" }

func waiterCommands(m map[string]int) (total int, desc string) {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		if !handshake(k) {
			total += m[k]
		}
	}
	return total, strings.Join(parts, ", ")
}

// notifyRig is a holder Guard and a waiting duplicate's Guard on the same
// keys, each with its own client; the waiter's commands are counted.
type notifyRig struct {
	holder, waiter *idem.Guard
	counter        *cmdCounter
	waiterRuns     atomic.Int64 // the waiter ran the function: it took the key over
}

type stamped struct {
	at  time.Time
	err error
}

// once makes the holder claim key and hold it; the waiter asks for the same
// key and waits. With hold > 0 the holder completes hold later; otherwise as
// soon as the waiter is subscribed and has checked the key again (its
// SSUBSCRIBE and its second claim are on the wire). It returns the time from
// the holder's return (its completion stored) to the waiter's return, and
// the commands the waiter's client sent meanwhile.
func (r *notifyRig) once(ctx context.Context, key string, hold time.Duration) (time.Duration, map[string]int, error) {
	ctx, cancel := context.WithTimeout(ctx, hold+15*time.Second)
	defer cancel()
	claimed, release := make(chan struct{}), make(chan struct{})
	holderDone, waiterDone := make(chan stamped, 1), make(chan stamped, 1)
	go func() {
		_, err := idem.Do(ctx, r.holder, key, theReq, func(ctx context.Context, a *idem.Attempt) (payment, error) {
			close(claimed)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return thePayment, nil
		})
		holderDone <- stamped{time.Now(), err}
	}()
	select {
	case <-claimed:
	case h := <-holderDone:
		return 0, nil, fmt.Errorf("the holder returned without running its function: %v", h.err)
	}
	before := r.counter.snapshot()
	go func() {
		p, err := idem.Do(ctx, r.waiter, key, theReq, func(ctx context.Context, a *idem.Attempt) (payment, error) {
			r.waiterRuns.Add(1)
			return thePayment, nil
		})
		if err == nil && p.ID != thePayment.ID {
			err = fmt.Errorf("the waiter got %+v", p)
		}
		waiterDone <- stamped{time.Now(), err}
	}()
	if hold > 0 {
		t := time.NewTimer(hold)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	} else {
		// Bounded: 2s, then the holder completes whatever the waiter does.
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(100 * time.Microsecond) {
			d := r.counter.since(before)
			if d["SSUBSCRIBE"] >= 1 && d["EVALSHA"]+d["EVAL"] >= 2 {
				break
			}
		}
		time.Sleep(time.Millisecond) // let its reply come back: the waiter now waits on the notification
	}
	close(release)
	var h, w stamped
	for range 2 {
		select {
		case h = <-holderDone:
		case w = <-waiterDone:
		case <-ctx.Done():
			return 0, nil, fmt.Errorf("key %s: %w", key, ctx.Err())
		}
	}
	if err := errors.Join(h.err, w.err); err != nil {
		return 0, nil, err
	}
	return w.at.Sub(h.at), r.counter.since(before), nil
}

// completeScriptPath is the core's complete.lua, relative to the bench
// module's directory (where `go run .` and `go test` run).
const completeScriptPath = "../lua/complete.lua"

// withoutPublish returns complete.lua's text without its notification: the
// `if … REDIS_VERSION_NUM … then` block that holds the SPUBLISH (up to its
// matching `end`), or a bare SPUBLISH line, removed; comments left as they
// are.
func withoutPublish(src string) (string, error) {
	lines := strings.SplitAfter(src, "\n")
	var out []string
	removed := 0
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if strings.HasPrefix(l, "--") {
			out = append(out, lines[i])
			continue
		}
		if strings.HasPrefix(l, "if ") && strings.Contains(l, "REDIS_VERSION_NUM") {
			if end := blockEnd(lines, i); end > i && strings.Contains(strings.Join(lines[i:end+1], ""), "SPUBLISH") {
				i = end
				removed++
				continue
			}
		}
		if strings.Contains(l, "SPUBLISH") {
			removed++
			continue
		}
		out = append(out, lines[i])
	}
	if removed == 0 {
		return "", errors.New("no SPUBLISH in " + completeScriptPath)
	}
	return strings.Join(out, ""), nil
}

// blockEnd returns the index of the `end` that closes the `if … then` opened
// on lines[start], or -1. Nested blocks are the `if … then` and `end` lines
// of the script's own style, one per line.
func blockEnd(lines []string, start int) int {
	depth := 0
	for i := start; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		switch {
		case strings.HasPrefix(l, "if ") && strings.HasSuffix(l, "then"):
			depth++
		case l == "end":
			depth--
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}

// cpuVariants returns two fresh-operation variants that differ only in the
// complete script: both claim with idem's RedisStore (the real claim.lua),
// then complete with EVALSHA of complete.lua's text, or of the same text
// without its SPUBLISH. Nobody subscribes: the fresh path when nobody waits.
func cpuVariants(e *env, clients int, withText, withoutText string) (with, without *variant) {
	mk := func(name, tag, text string) *variant {
		c, h := e.client(0, clients)
		st := idem.NewRedisStore(c, idem.WithPrefix("n"+tag+"-"+e.nonce))
		script := redis.NewScript(text)
		keys := keyer("k")
		retMs := retention.Milliseconds()
		const fp = "5f1d7a0c3b2e4f6a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a"
		return &variant{name: name, clients: clients, rt: h.n, srv: e.serverUsec,
			op: func(ctx context.Context, w int, seq uint64) error {
				id := keys.key(w, seq)
				owner := "owner-" + id
				res, err := st.Claim(ctx, id, idemstore.ClaimRequest{Owner: owner, Fingerprint: fp, Lease: 30 * time.Second, TTL: 30*time.Second + retention})
				if err != nil {
					return err
				}
				if res.Status != idemstore.ClaimOK {
					return fmt.Errorf("claim of a fresh key: status %d", res.Status)
				}
				rec, lease := st.Keys(id)
				n, err := script.Run(ctx, c, []string{rec, lease}, owner, rawPayload, retMs, "=").Int()
				if err == nil && n != 1 {
					err = fmt.Errorf("complete returned %d", n)
				}
				return err
			}}
	}
	return mk("claim + complete.lua (SPUBLISH, nobody subscribed)", "w", withText),
		mk("claim + complete.lua without its SPUBLISH", "o", withoutText)
}

// runNotify is scenario 9.
func runNotify(ctx context.Context, e *env) error {
	progress("scenario 9: notified waiters (%d keys for the lag, a %v wait for the commands)", e.cfg.notifyKeys, e.cfg.notifyHold)
	prefix := "w-" + e.nonce
	hc, _ := e.client(0, 4)
	counter := &cmdCounter{}
	wc := redis.NewClient(&redis.Options{Addr: e.redisAddr, PoolSize: 4})
	wc.AddHook(counter)
	e.onClose(func() { wc.Close() })
	r := &notifyRig{holder: e.guard(hc, prefix), waiter: e.guard(wc, prefix, idem.WithWait(10*time.Second)), counter: counter}

	// Wake-up lag, after one untimed key (connections, the store's one
	// question whether the server has sharded Pub/Sub).
	if _, _, err := r.once(ctx, "lag-warm", 0); err != nil {
		return fmt.Errorf("wake-up lag: %w", err)
	}
	var lags []time.Duration
	for i := range e.cfg.notifyKeys {
		lag, _, err := r.once(ctx, fmt.Sprintf("lag-%d", i), 0)
		if err != nil {
			return fmt.Errorf("wake-up lag: %w", err)
		}
		lags = append(lags, lag)
	}
	slices.Sort(lags)
	q := func(f float64) time.Duration { return lags[min(int(f*float64(len(lags))), len(lags)-1)] }
	median := lags[len(lags)/2]
	if len(lags)%2 == 0 {
		median = (lags[len(lags)/2-1] + lags[len(lags)/2]) / 2
	}
	progress("  wake-up lag over %d keys: min %v, median %v, p90 %v, max %v", len(lags), lags[0], median, q(0.9), lags[len(lags)-1])

	// Commands the waiter sends while it waits.
	const holds = 2
	var worst int
	var worstDesc string
	var descs []string
	for i := range holds {
		_, cmds, err := r.once(ctx, fmt.Sprintf("hold-%d", i), e.cfg.notifyHold)
		if err != nil {
			return fmt.Errorf("waiter commands: %w", err)
		}
		n, desc := waiterCommands(cmds)
		descs = append(descs, fmt.Sprintf("%d (%s)", n, desc))
		if n >= worst {
			worst, worstDesc = n, desc
		}
	}
	progress("  commands sent by a waiter during a %v wait: %s", e.cfg.notifyHold, strings.Join(descs, "; "))
	if n := r.waiterRuns.Load(); n > 0 {
		return fmt.Errorf("a waiter ran the function %d times: it should have got the holder's result", n)
	}

	// Redis CPU per fresh operation, with the notification and without.
	cpuTarget := fmt.Sprintf("notified waiters: Redis CPU per fresh op (claim + complete, nobody waits), complete.lua vs the same without SPUBLISH, INFO cpu, interleaved, %d clients", e.cfg.clients)
	var with, without *variant
	src, err := os.ReadFile(filepath.FromSlash(completeScriptPath))
	var stripped string
	if err == nil {
		stripped, err = withoutPublish(string(src))
	}
	if err != nil {
		progress("  Redis CPU with and without SPUBLISH: not measured: %v", err)
		e.rep.missing(cpuTarget, "≤ +5%", err.Error())
	} else {
		with, without = cpuVariants(e, e.cfg.clients, string(src), stripped)
		if err := compare(ctx, e.cfg, "notify: complete.lua with and without SPUBLISH", without, with); err != nil {
			return err
		}
		x := with.srvUsecPerOp()/without.srvUsecPerOp() - 1
		e.rep.maxTarget(cpuTarget, x, 0.05, fmt.Sprintf("%+.1f%% (%s vs %s µs)", 100*x, fmtF(with.srvUsecPerOp(), 1), fmtF(without.srvUsecPerOp(), 1)), "≤ +5%")
		// Is the file the script the library runs? idem.Do loaded its own
		// copy on this server (scenario 1, or here).
		if _, err := idem.Do(ctx, r.holder, "script-check", theReq, func(ctx context.Context, a *idem.Attempt) (payment, error) { return thePayment, nil }); err != nil {
			return err
		}
		sum := sha1.Sum(src)
		if ok, err := e.admin.ScriptExists(ctx, hex.EncodeToString(sum[:])).Result(); err != nil || len(ok) != 1 || !ok[0] {
			e.rep.notes = append(e.rep.notes, completeScriptPath+" is not the complete script idem.Do ran on this server (SCRIPT EXISTS): §9's CPU comparison may not be of the library's script")
		}
	}

	e.rep.maxTarget(fmt.Sprintf("notified waiters: wake-up lag after completion, median over %d keys", len(lags)),
		float64(median)/1e6, 10, fmt.Sprintf("%s (p90 %s, max %s)", fmtLag(median), fmtLag(q(0.9)), fmtLag(lags[len(lags)-1])), "≤ 10 ms")
	e.rep.maxTarget(fmt.Sprintf("notified waiters: commands sent by a waiter while it waits %v (worst of %d)", e.cfg.notifyHold, holds),
		float64(worst), 5, fmt.Sprintf("%d (%s)", worst, worstDesc), "≤ 5")

	sec := e.rep.section("9. Notified waiters", notifyNote(e, len(lags), holds, lags, median, descs))
	if with != nil {
		sec.pair(without, with)
	}
	return nil
}

// fmtLag is fmtDur for a lag that may be negative (the waiter may return
// before the holder's call does).
func fmtLag(d time.Duration) string {
	if d < 0 {
		return "−" + fmtDur(-d)
	}
	if d == 0 {
		return "0"
	}
	return fmtDur(d)
}

func notifyNote(e *env, keys, holds int, lags []time.Duration, median time.Duration, descs []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "On the standalone redis-server, two Guards on the same keys, each with its own go-redis client: a holder (no wait) "+
		"and a waiting duplicate (`idem.WithWait(10s)`). The holder claims a key and blocks in its function; the waiter calls `Do` "+
		"for the same key, is told the key is busy, subscribes (`SSUBSCRIBE` on the Guard's one shared subscriber connection), checks "+
		"the key again and waits. The waiter's commands are counted by a go-redis DialHook on its client that reads the RESP written on "+
		"every connection the client opens, the Pub/Sub one included (a ProcessHook does not see `SSUBSCRIBE`); go-redis's own "+
		"handshake on a new connection (`HELLO`, `CLIENT SETINFO`) is listed but not counted, as in the core's `TestWaiterIsNotified`.\n\n")
	fmt.Fprintf(&b, "**Wake-up lag**: over %d keys (after one untimed key), the holder completes as soon as the waiter's `SSUBSCRIBE` and "+
		"its second claim are on the wire (+1 ms); lag = the waiter's return − the holder's return (its completion stored; "+
		"negative when the notification overtakes the holder's own reply). Sorted: ", keys)
	var ls []string
	for _, l := range lags {
		ls = append(ls, fmtLag(l))
	}
	if len(ls) > 12 {
		ls = append(ls[:6], append([]string{"…"}, ls[len(ls)-6:]...)...)
	}
	fmt.Fprintf(&b, "%s; median %s. A polling waiter (before notifications) first looked after 25 ms, then every 50 ms.\n\n", strings.Join(ls, ", "), fmtLag(median))
	fmt.Fprintf(&b, "**Commands while waiting**: %d runs in which the holder keeps the waiter waiting %v before completing: %s "+
		"(the first claim, `SSUBSCRIBE`, the claim that closes the race with a completion in between, the claim after the notification; "+
		"a notified waiter checks on its own only every 2 s).\n\n", holds, e.cfg.notifyHold, strings.Join(descs, "; "))
	fmt.Fprintf(&b, "**Redis CPU of the notification**: the table below runs fresh operations on %d clients, interleaved, that differ only "+
		"in the complete script: both claim through `idem.NewRedisStore(…).Claim` (the real claim.lua), then run `EVALSHA` of `%s` as the "+
		"core embeds it, or of the same text with its `if … REDIS_VERSION_NUM … SPUBLISH … end` block removed (what completion cost before "+
		"notifications). Nobody subscribes, as on the fresh path when nobody waits. srv µs/op is redis-server's user + system CPU "+
		"(`INFO cpu`) over the rounds ÷ operations; the target compares these two figures.", e.cfg.clients, completeScriptPath)
	return b.String()
}
