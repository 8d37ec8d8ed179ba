package main

import (
	"io"
	"sync"
	"time"
)

// lineWriter writes log lines to w without making a request wait for the
// write: Write adds the line to a buffer, and one goroutine writes what the
// buffer holds, gathering the lines that come within gather of the first
// into one write (one system call, one wake-up of whatever reads the logs:
// under load, a line per request would cost a proxied replay a tenth of
// its time). Lines keep their order, each whole.
//
// When more than limit bytes wait (w does not keep up), Write waits too: the
// logs slow requests down rather than grow without bound. Close writes what
// is left; a process that dies at once loses the lines of its last gather
// and of the write under way.
type lineWriter struct {
	w      io.Writer
	limit  int
	gather time.Duration

	mu      sync.Mutex
	taken   sync.Cond // the goroutine took the buffer
	buf     []byte    // lines waiting
	waits   int       // how many times Write waited for room
	closed  bool
	wake    chan struct{} // one pending signal: there are lines
	closing chan struct{} // closed by Close: gather no more
	stopped chan struct{} // the goroutine has written its last lines
}

// idem proxy's log lines: at most 1 MiB of them (some thousands) wait for
// their write, which gathers those of 10 ms (a hundred writes a second at
// most, each a wake-up of the proxy and of the log's reader).
const (
	logBacklog = 1 << 20
	logGather  = 10 * time.Millisecond
)

// newLineWriter starts the writer of w, which gathers the lines that come
// within gather of the first into one write and holds at most limit bytes
// of lines waiting for their write.
func newLineWriter(w io.Writer, limit int, gather time.Duration) *lineWriter {
	l := &lineWriter{w: w, limit: limit, gather: gather, wake: make(chan struct{}, 1), closing: make(chan struct{}), stopped: make(chan struct{})}
	l.taken.L = &l.mu
	go l.run()
	return l
}

// Write adds p, one log line, to the lines waiting; after Close it writes
// p directly.
func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	for len(l.buf) > 0 && len(l.buf)+len(p) > l.limit && !l.closed {
		l.waits++
		l.taken.Wait()
	}
	if l.closed {
		l.mu.Unlock()
		<-l.stopped // after the lines before it
		return l.w.Write(p)
	}
	if len(l.buf) == 0 {
		l.wake <- struct{}{} // the first line since the goroutine took the buffer: room for one
	}
	l.buf = append(l.buf, p...)
	l.mu.Unlock()
	return len(p), nil
}

// run writes the waiting lines each time there are some, until Close.
func (l *lineWriter) run() {
	defer close(l.stopped)
	var spare []byte
	var gathering *time.Timer
	if l.gather > 0 {
		gathering = time.NewTimer(l.gather)
		gathering.Stop()
	}
	for range l.wake {
		if gathering != nil {
			gathering.Reset(l.gather)
			select {
			case <-gathering.C:
			case <-l.closing:
				gathering.Stop()
			}
		}
		l.mu.Lock()
		b := l.buf
		l.buf = spare[:0]
		l.taken.Broadcast()
		l.mu.Unlock()
		if len(b) > 0 {
			_, _ = l.w.Write(b) // a log line that cannot be written is lost, as with slog on w
		}
		spare = b
	}
	l.mu.Lock()
	b := l.buf
	l.buf = nil
	l.mu.Unlock()
	if len(b) > 0 {
		_, _ = l.w.Write(b)
	}
}

// Close writes the lines waiting and returns once they are written; later
// lines are written directly.
func (l *lineWriter) Close() error {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.closing)
		close(l.wake)
		l.taken.Broadcast()
	}
	l.mu.Unlock()
	<-l.stopped
	return nil
}
