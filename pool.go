package idem

import "sync"

// pool keeps values of one type for reuse, as a sync.Pool does, and makes
// one with fresh when it keeps none. A pool must not be copied.
type pool[T any] struct {
	p     sync.Pool
	fresh func() T
}

// get returns a kept value, or a fresh one.
func (p *pool[T]) get() T {
	if v, ok := p.p.Get().(T); ok {
		return v
	}
	return p.fresh()
}

// put keeps v for a later get.
func (p *pool[T]) put(v T) { p.p.Put(v) }
