package verify

import "sync"

// A Sink is a fenced receiver of effects, as a payment provider's idempotent
// API would be: it accepts an effect for a key only with a fence at least
// the highest it has seen for that key, and it answers, by key, which
// effect it accepted last, so that an attempt with Fence > 1 can reconcile
// instead of acting again. It records every effect offered in the History.
// Its methods may be called from any goroutine.
type Sink struct {
	h      *History
	remote *remote // set by Remote: effects go to a Handler's Sink

	mu   sync.Mutex
	keys map[string]*sinkKey
}

type sinkKey struct {
	high  int64  // the highest fence seen, by Apply or Lookup
	value string // the value of the effect accepted last
	has   bool
}

// NewSink returns a Sink that records its effects in h.
func NewSink(h *History) *Sink { return &Sink{h: h, keys: make(map[string]*sinkKey)} }

func (s *Sink) key(k string) *sinkKey {
	sk := s.keys[k]
	if sk == nil {
		sk = &sinkKey{}
		s.keys[k] = sk
	}
	return sk
}

// Lookup returns the value of the effect accepted for key, if any. The
// fence it carries counts as seen: a later effect with a lower fence is
// refused, as a provider that was asked by the newer attempt would refuse
// the older one.
func (s *Sink) Lookup(key string, fence int64) (value string, ok bool) {
	if s.remote != nil {
		m, _ := s.remote.do("lookup", remoteMsg{Key: key, Fence: fence})
		return m.Value, m.OK
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sk := s.key(key)
	sk.high = max(sk.high, fence)
	return sk.value, sk.has
}

// Apply offers the effect value for key with fence, from the function of
// call op, and reports whether the sink accepted it: whether fence is at
// least the highest fence seen for key.
func (s *Sink) Apply(op *Op, key string, fence int64, value string) bool {
	if s.remote != nil {
		if op.id < 0 {
			return false
		}
		m, _ := s.remote.do("apply", remoteMsg{ID: op.id, Key: key, Fence: fence, Value: value})
		return m.Accepted
	}
	at := s.h.Now()
	s.mu.Lock()
	sk := s.key(key)
	accepted := fence >= sk.high
	if accepted {
		sk.high, sk.value, sk.has = fence, value, true
	}
	s.mu.Unlock()
	s.h.AddEffect(Effect{Key: key, Fence: fence, Value: value, Call: op.ID(), At: at, Accepted: accepted})
	return accepted
}
