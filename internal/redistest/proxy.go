package redistest

import (
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A Proxy is a TCP proxy on a loopback port in front of a Redis server that
// delays bytes, per direction, and the replies of chosen commands: a slow
// network or an overloaded server, seen from the client. Point a go-redis
// client at Addr.
//
// Delays apply to bytes as they pass: a delayed reply holds back every reply
// behind it on the same connection, as TCP would. The server executes a
// command when its bytes reach it, so a delayed reply means a command that
// ran on time and answered late. Freeze stops it forwarding bytes at all,
// as a network partition or a frozen server would, until Thaw. Its methods
// may be called from any goroutine.
type Proxy struct {
	target string
	ln     net.Listener

	up, down atomic.Int64 // delay of every chunk, client→server and server→client, ns

	// hold is open while the proxy is frozen, closed by Thaw; nil when
	// bytes flow.
	hold atomic.Pointer[chan struct{}]

	mu       sync.Mutex
	rules    []*delayRule
	commands map[string]int // commands passed, by upper-case name
	conns    map[net.Conn]struct{}
	wg       sync.WaitGroup
	done     bool
}

type delayRule struct {
	match   Matcher
	delay   time.Duration
	left    int
	delayed int
}

// StartProxy starts a proxy to target on a free loopback port, stopped by
// tb.Cleanup.
func StartProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("redistest: proxy: %v", err)
	}
	p := &Proxy{target: target, ln: ln, conns: make(map[net.Conn]struct{})}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.Close)
	return p
}

// Addr returns the proxy's address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetDelay delays every chunk of bytes client→server by up and server→client
// by down, from now on (0 for none).
func (p *Proxy) SetDelay(up, down time.Duration) {
	p.up.Store(int64(up))
	p.down.Store(int64(down))
}

// DelayReplies delays the replies of the next n commands that match by d
// (on top of SetDelay's). Rules added earlier are tried first. It returns a
// function that reports how many replies the rule has delayed so far.
func (p *Proxy) DelayReplies(match Matcher, d time.Duration, n int) (delayed func() int) {
	r := &delayRule{match: match, delay: d, left: n}
	p.mu.Lock()
	p.rules = append(p.rules, r)
	p.mu.Unlock()
	return func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		return r.delayed
	}
}

// Freeze stops forwarding bytes in both directions: connections stay open
// (new ones are accepted), what either side writes waits in the proxy, and
// no command reaches the server or is answered, as when the network between
// them partitions. Thaw forwards what waited, in order: a command written
// by a client that gave up and closed its connection meanwhile still
// reaches the server, as it would over TCP.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.done { // Close thaws for good
		ch := make(chan struct{})
		p.hold.CompareAndSwap(nil, &ch)
	}
}

// Thaw forwards the bytes held since Freeze, in order, and lets the next
// ones pass. Thaw without Freeze does nothing.
func (p *Proxy) Thaw() {
	if ch := p.hold.Swap(nil); ch != nil {
		close(*ch)
	}
}

// held waits while the proxy is frozen.
func (p *Proxy) held() {
	if ch := p.hold.Load(); ch != nil {
		<-*ch
	}
}

// ClearRules drops every rule added by DelayReplies.
func (p *Proxy) ClearRules() {
	p.mu.Lock()
	p.rules = nil
	p.mu.Unlock()
}

// Commands returns how many commands of each name (upper case) passed
// client→server since the last call, and starts counting again.
func (p *Proxy) Commands() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.commands
	p.commands = nil
	return c
}

// replyDelay counts the command args and returns the extra delay of its
// reply.
func (p *Proxy) replyDelay(args []string) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(args) > 0 {
		if p.commands == nil {
			p.commands = make(map[string]int)
		}
		p.commands[strings.ToUpper(args[0])]++
	}
	for _, r := range p.rules {
		if r.left > 0 && r.match(args) {
			r.left--
			r.delayed++
			return r.delay
		}
	}
	return 0
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.done {
		p.mu.Unlock()
		return
	}
	p.done = true
	p.Thaw() // a held chunk's write then fails on its closed connection
	_ = p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.DialTimeout("tcp", p.target, 2*time.Second)
		if err != nil {
			_ = client.Close()
			continue
		}
		if !p.track(client, server) {
			_ = client.Close()
			_ = server.Close()
			return
		}
		pending := make(chan time.Duration, 1<<16) // reply delays, in command order
		p.wg.Add(2)
		go p.upstream(client, server, pending)
		go p.downstream(server, client, pending)
	}
}

// timed is a chunk of bytes and the moment it may be written on.
type timed struct {
	b  []byte
	at time.Time
}

// pump writes the chunks it receives, each at its moment, in order, none
// while the proxy is frozen.
func (p *Proxy) pump(dst net.Conn, in <-chan timed) {
	for c := range in {
		if d := time.Until(c.at); d > 0 {
			time.Sleep(d) // the simulated delay itself
		}
		p.held()
		if _, err := dst.Write(c.b); err != nil {
			_ = dst.Close()
			for range in {
			}
			return
		}
	}
}

// upstream copies client→server, telling downstream the reply delay of each
// command as it passes.
func (p *Proxy) upstream(client, server net.Conn, pending chan<- time.Duration) {
	defer p.wg.Done()
	out := make(chan timed, 1024)
	drained := make(chan struct{})
	go func() { p.pump(server, out); close(drained) }()
	defer close(out)
	defer close(pending)
	var buf []byte
	parse := true
	chunk := make([]byte, 32<<10)
	for {
		n, err := client.Read(chunk)
		if n > 0 {
			b := append([]byte(nil), chunk[:n]...)
			if parse {
				buf = append(buf, b...)
				for {
					args, m, ok, perr := parseCommand(buf)
					if perr != nil {
						parse = false // not RESP we understand: stop delaying replies
						break
					}
					if !ok {
						break
					}
					pending <- p.replyDelay(args)
					buf = buf[m:]
				}
			}
			out <- timed{b: b, at: time.Now().Add(time.Duration(p.up.Load()))}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_ = client.Close()
			}
			if p.hold.Load() != nil {
				// Frozen: what the client wrote before it went is on its
				// way, as over TCP; the server gets it, then the close,
				// once the proxy thaws.
				p.wg.Add(1)
				go func() { defer p.wg.Done(); <-drained; _ = server.Close() }()
				return
			}
			_ = server.Close()
			return
		}
	}
}

// downstream copies server→client, holding each reply for its command's delay.
func (p *Proxy) downstream(server, client net.Conn, pending <-chan time.Duration) {
	defer p.wg.Done()
	out := make(chan timed, 1024)
	go p.pump(client, out)
	defer close(out)
	var buf []byte
	frame := true
	chunk := make([]byte, 32<<10)
	for {
		n, err := server.Read(chunk)
		if n > 0 {
			buf = append(buf, chunk[:n]...)
			now := time.Now()
			base := now.Add(time.Duration(p.down.Load()))
			for len(buf) > 0 {
				m := len(buf)
				var extra time.Duration
				if frame {
					var ok bool
					var ferr error
					m, ok, ferr = frameReply(buf)
					if ferr != nil {
						frame, m = false, len(buf)
					} else if !ok {
						break
					} else if buf[0] != '>' { // a push is no command's reply
						select {
						case d, open := <-pending:
							if open {
								extra = d
							}
						default:
						}
					}
				}
				out <- timed{b: append([]byte(nil), buf[:m]...), at: base.Add(extra)}
				buf = buf[m:]
			}
		}
		if err != nil {
			_ = client.Close()
			return
		}
	}
}
