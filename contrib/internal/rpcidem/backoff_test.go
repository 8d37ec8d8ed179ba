package rpcidem

import (
	"math"
	"math/big"
	mrand "math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ceiling is the documented bound of the wait before retry n:
// min(limit, base·2ⁿ⁻¹), computed without overflow.
func ceiling(base, limit time.Duration, retry int) time.Duration {
	c := new(big.Int).Lsh(big.NewInt(int64(base)), uint(retry-1))
	if c.Cmp(big.NewInt(int64(limit))) > 0 {
		return limit
	}
	return time.Duration(c.Int64())
}

// TestBackoff: before retry n the client waits a draw from [0, min(limit,
// base·2ⁿ⁻¹)), for any base up to the limit (NewClient raises a lower
// limit to the base), up to the largest durations and retry numbers.
func TestBackoff(t *testing.T) {
	top := func(n int64) int64 { return n - 1 } // the largest draw
	const maxDuration = time.Duration(math.MaxInt64)
	for _, b := range []backoff{
		{base: 100 * time.Millisecond, limit: time.Second},
		{base: defaultBackoff, limit: defaultBackoffCap},
		{base: 3, limit: 7},
		{base: 500, limit: 1001},
		{base: 500, limit: 1000},
		{base: 1, limit: 1},
		{base: time.Hour, limit: maxDuration},
		{base: 1, limit: maxDuration},
		{base: maxDuration / 3, limit: maxDuration / 3},
		{base: maxDuration / 2, limit: maxDuration},
	} {
		for retry := 1; retry <= 100; retry++ {
			want := ceiling(b.base, b.limit, retry)
			require.Equal(t, want-1, b.jittered(retry, top), "%v, retry %d", b, retry)
		}
	}
	b := backoff{base: 100 * time.Millisecond, limit: time.Second}
	for retry, want := range map[int]time.Duration{1: 100, 2: 200, 3: 400, 4: 800, 5: 1000, 100: 1000} {
		require.Equal(t, want*time.Millisecond-1, b.jittered(retry, top), "retry %d", retry)
	}
	require.Zero(t, b.jittered(3, func(int64) int64 { return 0 }), "the smallest draw")
}

// TestBackoffNoBase: a backoff without a base never waits, and never asks
// the random source for a draw from an empty range (math/rand's Int64N
// panics on it).
func TestBackoffNoBase(t *testing.T) {
	for retry := 1; retry <= 3; retry++ {
		require.Zero(t, backoff{}.jittered(retry, mrand.Int64N))
		require.Zero(t, backoff{limit: time.Second}.jittered(retry, mrand.Int64N))
	}
}

// TestBackoffRandom: with the client's random source, every wait is within
// its bound.
func TestBackoffRandom(t *testing.T) {
	b := backoff{base: time.Millisecond, limit: 8 * time.Millisecond}
	for retry := 1; retry <= 6; retry++ {
		for range 50 {
			d := b.jittered(retry, mrand.Int64N)
			require.GreaterOrEqual(t, d, time.Duration(0))
			require.Less(t, d, ceiling(b.base, b.limit, retry))
		}
	}
}
