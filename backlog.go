package idem

import "sync"

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
