package main

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// gatedWriter records its writes; each write waits for a token on gate
// when gate is not nil.
type gatedWriter struct {
	gate    chan struct{}
	entered chan struct{} // receives when a write starts, if not nil
	mu      sync.Mutex
	writes  []string
}

func (w *gatedWriter) Write(p []byte) (int, error) {
	if w.entered != nil {
		w.entered <- struct{}{}
	}
	if w.gate != nil {
		<-w.gate
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes = append(w.writes, string(p))
	return len(p), nil
}

func (w *gatedWriter) all() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.writes, "")
}

// TestLineWriterOrder: lines written from many goroutines at once all come
// out, whole, each goroutine's in its order, by the time Close returns.
func TestLineWriterOrder(t *testing.T) {
	w := &gatedWriter{}
	l := newLineWriter(w, 1<<20, 0)
	var mu sync.Mutex // slog's handler writes one line at a time
	const writers, lines = 8, 500
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := range lines {
				mu.Lock()
				_, err := fmt.Fprintf(l, "g%d line %04d %s\n", g, i, strings.Repeat("x", i%64))
				mu.Unlock()
				require.NoError(t, err)
			}
		})
	}
	wg.Wait()
	require.NoError(t, l.Close())
	got := strings.Split(strings.TrimSuffix(w.all(), "\n"), "\n")
	require.Len(t, got, writers*lines)
	next := make([]int, writers)
	for _, line := range got {
		var g, i int
		var pad string
		_, err := fmt.Sscanf(line, "g%d line %d %s", &g, &i, &pad)
		if i%64 == 0 {
			_, err = fmt.Sscanf(line, "g%d line %d", &g, &i)
		}
		require.NoError(t, err, line)
		require.Equal(t, next[g], i, "goroutine %d's lines in order", g)
		require.Equal(t, strings.Repeat("x", i%64), pad, "whole: %q", line)
		next[g]++
	}
	require.Less(t, len(w.writes), writers*lines, "lines that came during a write share the next one")
}

// TestLineWriterAlone: a line written alone goes out without waiting for
// another, and lines written during a write go out together in the next.
func TestLineWriterAlone(t *testing.T) {
	w := &gatedWriter{gate: make(chan struct{}), entered: make(chan struct{})}
	l := newLineWriter(w, 1<<20, 0)
	_, _ = l.Write([]byte("one\n"))
	<-w.entered // its write started with nothing else to wait for
	_, _ = l.Write([]byte("two\n"))
	_, _ = l.Write([]byte("three\n"))
	w.gate <- struct{}{}
	<-w.entered
	w.gate <- struct{}{}
	require.NoError(t, l.Close())
	require.Equal(t, []string{"one\n", "two\nthree\n"}, w.writes)
}

// TestLineWriterBounded: when the lines waiting would pass the limit,
// Write waits for the write under way instead of growing the buffer.
func TestLineWriterBounded(t *testing.T) {
	w := &gatedWriter{gate: make(chan struct{}), entered: make(chan struct{}, 8)}
	l := newLineWriter(w, 10, 0)
	_, _ = l.Write([]byte("0123456789\n")) // taken at once: the write waits on the gate
	<-w.entered
	_, _ = l.Write([]byte("abcdefgh\n")) // waits: 9 bytes, within the limit
	wrote := make(chan struct{})
	go func() {
		_, _ = l.Write([]byte("XY\n")) // 9 + 3 > 10: waits for the buffer to be taken
		close(wrote)
	}()
	for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
		l.mu.Lock()
		waits := l.waits
		l.mu.Unlock()
		if waits > 0 {
			break
		}
		select {
		case <-wrote:
			t.Fatal("Write did not wait with the buffer full")
		default:
		}
		require.True(t, time.Now().Before(deadline), "Write neither waited nor returned")
	}
	w.gate <- struct{}{} // the first write ends; the second starts
	<-w.entered
	<-wrote // the buffer was taken: room again
	close(w.gate)
	require.NoError(t, l.Close())
	require.Equal(t, "0123456789\nabcdefgh\nXY\n", w.all())
}

// TestLineWriterAfterClose: a line written after Close goes out directly.
func TestLineWriterAfterClose(t *testing.T) {
	var buf bytes.Buffer
	l := newLineWriter(&buf, 1<<10, 0)
	_, _ = l.Write([]byte("before\n"))
	require.NoError(t, l.Close())
	require.NoError(t, l.Close(), "twice")
	_, err := l.Write([]byte("after\n"))
	require.NoError(t, err)
	require.Equal(t, "before\nafter\n", buf.String())
}

// TestLineWriterGathers: the lines that come while the first waits for its
// gather go out in one write; Close ends the gather at once.
func TestLineWriterGathers(t *testing.T) {
	w := &gatedWriter{}
	l := newLineWriter(w, 1<<20, time.Hour)
	for _, line := range []string{"one\n", "two\n", "three\n"} {
		_, _ = l.Write([]byte(line))
	}
	require.NoError(t, l.Close())
	require.Equal(t, []string{"one\ntwo\nthree\n"}, w.writes)
}

// TestLineWriterGatherEnds: a line alone is written once its gather ends,
// without Close.
func TestLineWriterGatherEnds(t *testing.T) {
	w := &gatedWriter{entered: make(chan struct{}, 1)}
	l := newLineWriter(w, 1<<20, time.Millisecond)
	defer l.Close()
	_, _ = l.Write([]byte("one\n"))
	select {
	case <-w.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the line was not written")
	}
}
