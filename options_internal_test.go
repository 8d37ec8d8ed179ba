package idem

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestGuardOptionBounds: zero or a negative duration means the default, a
// value below the floor is raised to it, others are kept, as the options
// say.
func TestGuardOptionBounds(t *testing.T) {
	require.Equal(t, time.Second, defaultStoreTimeout, "the store timeout users get")
	s := &busyStore{}
	for _, d := range []time.Duration{0, -time.Second} {
		g := New(s, WithLease(d), WithRetention(d), WithWriteTimeout(d), WithStoreTimeout(d), WithWait(d))
		require.Equal(t, defaultLease, g.lease, "lease %v", d)
		require.Equal(t, defaultRetention, g.retention, "retention %v", d)
		require.Equal(t, storeTimeoutDefault, g.budget, "store timeout %v", d)
		require.Equal(t, storeTimeoutDefault, g.write, "write timeout %v: the store timeout", d)
		require.Zero(t, g.wait, "wait %v", d)
	}
	g := New(s, WithLease(time.Nanosecond), WithWriteTimeout(time.Nanosecond), WithStoreTimeout(time.Nanosecond))
	require.Equal(t, minLease, g.lease)
	require.Equal(t, minWriteTimeout, g.write)
	require.Equal(t, minStoreTimeout, g.budget)
	g = New(s, WithLease(time.Minute), WithRetention(time.Hour), WithWriteTimeout(time.Second), WithWait(time.Second), WithStoreTimeout(3*time.Second))
	require.Equal(t, []time.Duration{time.Minute, time.Hour, time.Second, time.Second, 3 * time.Second}, []time.Duration{g.lease, g.retention, g.write, g.wait, g.budget})
	g = New(s, WithStoreTimeout(3*time.Second))
	require.Equal(t, 3*time.Second, g.write, "the completion waits the store timeout")
}

// TestReplicaAckTimeout: WithReplicaAck's timeout is kept when positive and
// 1s otherwise: a WAIT without a timeout would block for ever.
func TestReplicaAckTimeout(t *testing.T) {
	for d, want := range map[time.Duration]time.Duration{0: time.Second, -time.Second: time.Second, 5 * time.Second: 5 * time.Second} {
		var s RedisStore
		WithReplicaAck(1, d)(&s)
		require.Equal(t, want, s.ackWait, "timeout %v", d)
	}
}
