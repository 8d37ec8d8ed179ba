package redistest

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
)

// A Matcher reports whether a command, given as its arguments with the
// command name first (as written by the client), is one whose reply a
// ReplyDropper may drop.
type Matcher func(args []string) bool

// MatchCommand matches commands by name, case-insensitively.
func MatchCommand(name string) Matcher {
	return func(args []string) bool {
		return len(args) > 0 && strings.EqualFold(args[0], name)
	}
}

// MatchScript matches every way go-redis runs the Lua script src: EVAL and
// EVAL_RO carrying src, EVALSHA and EVALSHA_RO carrying its SHA-1.
func MatchScript(src string) Matcher {
	sum := sha1.Sum([]byte(src))
	sha := hex.EncodeToString(sum[:])
	return func(args []string) bool {
		if len(args) < 2 {
			return false
		}
		switch strings.ToUpper(args[0]) {
		case "EVAL", "EVAL_RO":
			return args[1] == src
		case "EVALSHA", "EVALSHA_RO":
			return strings.EqualFold(args[1], sha)
		}
		return false
	}
}

// MatchSubstring matches commands any of whose arguments (the name
// included) contains s.
func MatchSubstring(s string) Matcher {
	return func(args []string) bool {
		for _, a := range args {
			if strings.Contains(a, s) {
				return true
			}
		}
		return false
	}
}

// A ReplyDropper simulates the loss of a reply after the server executed the
// command: its Dial method, used as go-redis Options.Dialer (or
// ClusterOptions.Dialer), returns connections that watch the commands
// written. When the reply to a matching command arrives and is not an error
// reply (an error such as NOSCRIPT means nothing ran), the connection is
// closed and the client's read fails with io.EOF instead, as when a network
// or Redis failover cuts the connection right after execution. go-redis then
// re-sends the command (up to MaxRetries), so the command runs twice.
//
// A ReplyDropper drops at most as many replies as it is armed for, counted
// over all its connections. Its methods may be called from any goroutine.
type ReplyDropper struct {
	match   Matcher
	budget  atomic.Int64
	dropped atomic.Int64
	dialer  net.Dialer
}

// NewReplyDropper returns a ReplyDropper that drops the replies of the first
// n commands that match and succeed (get a reply other than an error).
func NewReplyDropper(match Matcher, n int) *ReplyDropper {
	d := &ReplyDropper{match: match}
	d.budget.Store(int64(n))
	return d
}

// Arm sets the number of replies still to drop (0 disarms it).
func (d *ReplyDropper) Arm(n int) { d.budget.Store(int64(n)) }

// Dropped returns the number of replies dropped so far.
func (d *ReplyDropper) Dropped() int { return int(d.dropped.Load()) }

// take consumes one drop from the budget, reporting whether there was one.
func (d *ReplyDropper) take() bool {
	for {
		n := d.budget.Load()
		if n <= 0 {
			return false
		}
		if d.budget.CompareAndSwap(n, n-1) {
			d.dropped.Add(1)
			return true
		}
	}
}

// Dial connects like net.Dialer and wraps the connection. It has the
// signature of go-redis Options.Dialer.
func (d *ReplyDropper) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := d.dialer.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &dropConn{Conn: conn, d: d}, nil
}

// dropConn pairs each command written with its reply by parsing both RESP
// streams: every command gets exactly one reply, in order, and RESP3 push
// messages are nobody's reply. That holds for everything go-redis sends
// except Pub/Sub, MONITOR and CLIENT REPLY, which these tests do not use.
// When either stream cannot be parsed the connection stops interfering.
type dropConn struct {
	net.Conn
	d *ReplyDropper

	mu       sync.Mutex
	pending  []bool // per command awaiting its reply: may its reply be dropped?
	disabled bool

	wbuf []byte // written bytes not yet parsed into whole commands (writer only)

	rbuf    []byte // bytes read from the server, not yet framed (reader only)
	out     []byte // framed replies to hand to the client (reader only)
	dropped bool   // a reply was dropped: the client reads io.EOF (reader only)
	chunk   []byte // read buffer (reader only)
}

func (c *dropConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if !c.disabled {
		c.wbuf = append(c.wbuf, p...)
		for {
			args, n, ok, err := parseCommand(c.wbuf)
			if err != nil {
				c.disabled = true
				break
			}
			if !ok {
				break
			}
			c.pending = append(c.pending, c.d.match(args))
			c.wbuf = c.wbuf[n:]
		}
		if len(c.wbuf) == 0 {
			c.wbuf = nil
		}
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *dropConn) Read(p []byte) (int, error) {
	for {
		if len(c.out) > 0 {
			n := copy(p, c.out)
			c.out = c.out[n:]
			return n, nil
		}
		if c.dropped {
			return 0, io.EOF
		}
		if c.chunk == nil {
			c.chunk = make([]byte, 32*1024)
		}
		n, err := c.Conn.Read(c.chunk)
		c.rbuf = append(c.rbuf, c.chunk[:n]...)
		c.frame()
		if err != nil && len(c.out) == 0 && !c.dropped {
			// Not sticky: after a timeout the client may read again; a
			// partial reply stays in rbuf for that.
			return 0, err
		}
	}
}

// frame moves the complete replies at the front of rbuf to out, or drops
// one and breaks the connection.
func (c *dropConn) frame() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.rbuf) > 0 && !c.dropped {
		if c.disabled {
			c.out = append(c.out, c.rbuf...)
			c.rbuf = nil
			return
		}
		n, ok, err := frameReply(c.rbuf)
		if err != nil {
			c.disabled = true
			continue
		}
		if !ok {
			return
		}
		reply := c.rbuf[:n]
		if reply[0] != '>' && len(c.pending) > 0 { // a push is no command's reply
			candidate := c.pending[0]
			c.pending = c.pending[1:]
			isError := reply[0] == '-' || reply[0] == '!'
			if candidate && !isError && c.d.take() {
				// The server has executed the command and answered; the
				// client never learns it.
				_ = c.Conn.Close()
				c.rbuf = nil
				c.dropped = true
				return
			}
		}
		c.out = append(c.out, reply...)
		c.rbuf = c.rbuf[n:]
	}
	if len(c.rbuf) == 0 {
		c.rbuf = nil
	}
}
