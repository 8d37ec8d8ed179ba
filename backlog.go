package idem

import (
	"sync"
	"sync/atomic"
)

// backlog counts a Guard's background writes.
type backlog struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; nil while n is 0
}

func (b *backlog) add() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n == 0 {
		b.idle = make(chan struct{})
	}
	b.n++
}

func (b *backlog) done() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n--
	if b.n == 0 {
		close(b.idle)
		b.idle = nil
	}
}

// wait returns a channel closed when no write is left, nil when none is.
func (b *backlog) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.idle
}

// takeBacks counts, by operation id, the take-backs of claims going on in
// the background, for the repeats of their keys to wait for.
type takeBacks struct {
	n  atomic.Int64 // take-backs going on, of every id: 0 spares the lock
	mu sync.Mutex
	m  map[string]*takeBackSet
}

// takeBackSet is the take-backs of one id: how many, and a channel closed
// when the last one ends.
type takeBackSet struct {
	n    int
	done chan struct{}
}

func (t *takeBacks) add(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = make(map[string]*takeBackSet)
	}
	s := t.m[id]
	if s == nil {
		s = &takeBackSet{done: make(chan struct{})}
		t.m[id] = s
	}
	s.n++
	t.n.Add(1)
}

func (t *takeBacks) remove(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.m[id]
	if s.n--; s.n == 0 {
		close(s.done)
		delete(t.m, id)
	}
	t.n.Add(-1)
}

// ended returns a channel closed when no take-back of id goes on, nil
// when none does.
func (t *takeBacks) ended(id string) <-chan struct{} {
	if t.n.Load() == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.m[id]; s != nil {
		return s.done
	}
	return nil
}
