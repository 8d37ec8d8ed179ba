package idem

import (
	"context"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// luaScript is a Lua script of the store, run by its SHA1 digest (EVALSHA)
// and loaded by EVAL when the server does not know it yet.
type luaScript struct {
	src, sha any  // boxed once: every command refers to them
	direct   bool // never auto-pipelined (WithAutoPipeline)
}

func newScript(src string) *luaScript {
	return &luaScript{src: src, sha: redis.NewScript(src).Hash()}
}

// newDirectScript returns a script that is sent directly on the client even
// with WithAutoPipeline: lease renewals, which must not wait behind a batch.
func newDirectScript(src string) *luaScript {
	l := newScript(src)
	l.direct = true
	return l
}

// scriptCall is one run of a store script: the arguments of its EVALSHA
// and the bytes its keys and text arguments are made of, in one
// allocation. go-redis boxes every argument into an interface, which costs
// an allocation per string; a call instead hands it pointers into itself
// (free to box), which go-redis writes by MarshalBinary and prints, in a
// hook or a log line, by String. A call is built and run once; the hot
// paths (claims and completions) then hand it back with done, to be reused.
type scriptCall struct {
	script *luaScript
	argv   [12]any // evalsha, sha, numkeys, keys, arguments
	n      int
	texts  [6]callText
	nt     int
	// running: a command of the call may still be written after its
	// caller stopped waiting for it (WithAutoPipeline, a context that
	// ended first), so the call must not be reused.
	running bool
	b       []byte // buf, until a long prefix or argument outgrows it
	buf     [256]byte
}

// scriptCalls are the calls handed back by done.
var scriptCalls = pool[*scriptCall]{fresh: func() *scriptCall { return new(scriptCall) }}

// callText is a key or a text argument of a scriptCall.
type callText struct{ b []byte }

// MarshalBinary returns the argument's bytes, as go-redis writes them.
func (t *callText) MarshalBinary() ([]byte, error) { return t.b, nil }

// String returns the argument as go-redis prints it (and routes a key on
// Redis Cluster).
func (t *callText) String() string { return string(t.b) }

// call starts a run of script on the operation id, with its record key, its
// lease key, or both (in that order) as the script's keys.
func (s *RedisStore) call(script *luaScript, id string, record, lease bool) *scriptCall {
	c := scriptCalls.get()
	c.script, c.n, c.nt, c.running = script, 3, 0, false
	c.b = c.buf[:0]
	c.argv[0], c.argv[1] = "evalsha", script.sha
	// One run of bytes holds both keys: "<prefix>:{<id>}:l" and, without
	// its last two bytes, "<prefix>:{<id>}".
	c.b = append(append(append(append(c.b, s.prefix...), ":{"...), id...), "}:l"...)
	k := c.b
	nk := 0
	if record {
		c.bytes(k[:len(k)-2])
		nk++
	}
	if lease {
		c.bytes(k)
		nk++
	}
	c.argv[2] = nk
	return c
}

// text adds a text argument, copied into the call.
func (c *scriptCall) text(s string) {
	start := len(c.b)
	c.b = append(c.b, s...)
	// When the append moved c.b, earlier arguments keep the old array,
	// which still holds their bytes.
	c.bytes(c.b[start:len(c.b):len(c.b)])
}

// freshRecord adds the record a claim of a fresh key creates (claim.lua's
// ARGV[1]): 1P|1|OWNER|FINGERPRINT|CREATED|, with now, the caller's clock in
// Unix seconds, as CREATED.
func (c *scriptCall) freshRecord(owner, fp string, now int64) {
	start := len(c.b)
	c.b = append(c.b, recordFormat+"P|1|"...)
	c.b = append(append(append(c.b, owner...), '|'), fp...)
	c.b = append(strconv.AppendInt(append(c.b, '|'), now, 10), '|')
	c.bytes(c.b[start:len(c.b):len(c.b)])
}

// list adds a text argument made of the strings of l, comma-separated.
func (c *scriptCall) list(l []string) {
	start := len(c.b)
	for i, s := range l {
		if i > 0 {
			c.b = append(c.b, ',')
		}
		c.b = append(c.b, s...)
	}
	c.bytes(c.b[start:len(c.b):len(c.b)])
}

// bytes adds an argument that refers to b, which must not change until the
// call has run.
func (c *scriptCall) bytes(b []byte) {
	t := &c.texts[c.nt]
	c.nt++
	t.b = b
	c.arg(t)
}

// arg adds an argument as it is, for values boxed once (ms, flags).
func (c *scriptCall) arg(v any) {
	c.argv[c.n] = v
	c.n++
}

// done hands the call back for reuse once its command has run and its reply
// was read: nothing refers to its arguments any more, unless a command of
// it may still be sent (running), when it is left to the collector.
func (c *scriptCall) done() {
	if c.running {
		return
	}
	clear(c.argv[:c.n]) // a payload argument refers to the caller's bytes
	clear(c.texts[:c.nt])
	if cap(c.b) > len(c.buf) {
		c.b = nil // outgrown: not kept
	}
	scriptCalls.put(c)
}

// firstKey returns the first key of the call.
func (c *scriptCall) firstKey() string { return c.texts[0].String() }

// cmd returns the call's command, routed by its first key; with source
// set, it is the EVAL that loads the script.
func (c *scriptCall) cmd(ctx context.Context, source bool) *redis.Cmd {
	a := c.argv[:c.n]
	if source {
		a[0], a[1] = "eval", c.script.src
	}
	cmd := redis.NewCmd(ctx, a...)
	cmd.SetFirstKeyPos(3)
	return cmd
}
