// Package childtest runs the test binary itself as a child process, for
// tests that freeze, kill or outlive the process holding a lease. The child
// is one test of the same binary, chosen by name; it reports events as JSON
// lines on its standard output.
package childtest

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// patience bounds how long Next and Wait wait for a child.
const patience = 20 * time.Second

// Event is what a child reports, one JSON line each; lines whose Name is
// empty, or that are not JSON, are not events.
type Event interface{ Name() string }

// None is the event type of a child that reports nothing.
type None struct{}

// Name returns "": a None is never an event.
func (None) Name() string { return "" }

// Child is a running child process.
type Child[E Event] struct {
	Cmd    *exec.Cmd
	Stdin  io.WriteCloser // closed, it tells a child that reads it to stop
	events chan E
	stderr lockedBuilder
	waited chan struct{}
	err    error // of Wait, once waited is closed
}

// Start runs the test named test of this binary as a child, with env added
// to the environment and timeout as its -test.timeout (0: none). At the end
// of t the child is resumed if frozen, killed and waited for.
func Start[E Event](t testing.TB, test string, timeout time.Duration, env ...string) *Child[E] {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1", "-test.timeout="+timeout.String())
	cmd.Env = append(os.Environ(), env...)
	c := &Child[E]{Cmd: cmd, events: make(chan E, 8), waited: make(chan struct{})}
	cmd.Stderr = &c.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if c.Stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev E
			if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Name() != "" {
				c.events <- ev
			}
		}
		close(c.events)
		c.err = cmd.Wait()
		close(c.waited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-c.waited
	})
	return c
}

// Next returns the child's next event, which must be named want.
func (c *Child[E]) Next(t testing.TB, want string) E {
	t.Helper()
	select {
	case ev, ok := <-c.events:
		if !ok {
			t.Fatalf("child exited before %q: %v\n%s", want, c.Wait(t), c.Stderr())
		}
		if ev.Name() != want {
			t.Fatalf("child event %+v, want %q", ev, want)
		}
		return ev
	case <-time.After(patience):
		t.Fatalf("no %q from the child:\n%s", want, c.Stderr())
	}
	var zero E
	return zero
}

// Wait waits for the child to exit and returns Wait's error.
func (c *Child[E]) Wait(t testing.TB) error {
	t.Helper()
	select {
	case <-c.waited:
		return c.err
	case <-time.After(patience):
		t.Fatalf("child did not exit:\n%s", c.Stderr())
	}
	return nil
}

// Signal sends sig to the child.
func (c *Child[E]) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := c.Cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// Stderr returns what the child wrote to its standard error so far.
func (c *Child[E]) Stderr() string { return c.stderr.String() }

// lockedBuilder is a strings.Builder safe for one writer and other readers.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
