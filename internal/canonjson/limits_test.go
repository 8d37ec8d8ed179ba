package canonjson

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// This file checks the limits: how deep a text may nest, how long the
// check of names takes on large objects, and what a reused Canonicalizer
// keeps and allocates.

// TestCanonicalJSONDepth: Append accepts the nesting encoding/json accepts,
// maxJSONDepth objects and arrays open at once, with a value or empty at
// the bottom, and refuses one more.
func TestCanonicalJSONDepth(t *testing.T) {
	// nested returns bottom inside n arrays (kinds "["), objects ("{") or
	// both in turn ("[{").
	nested := func(kinds string, n int, bottom string) []byte {
		var open, close []string
		for k := range n {
			if kinds[k%len(kinds)] == '[' {
				open, close = append(open, "["), append(close, "]")
			} else {
				open, close = append(open, `{"k":`), append(close, "}")
			}
		}
		slices.Reverse(close)
		return []byte(strings.Join(open, "") + bottom + strings.Join(close, ""))
	}
	for _, kinds := range []string{"[", "{", "[{"} {
		for _, bottom := range []string{"1", `""`, "[]", "{}"} {
			for _, extra := range []int{0, 1} {
				open := maxJSONDepth + extra // objects and arrays open at once
				around := open
				if bottom == "[]" || bottom == "{}" {
					around--
				}
				in := nested(kinds, around, bottom)
				what := fmt.Sprintf("%q, %d open, %s at the bottom", kinds, open, bottom)
				require.Equal(t, extra == 0, json.Valid(in), "%s: as encoding/json", what)
				out, ok := appendBounded(t, nil, in)
				require.Equal(t, extra == 0, ok, what)
				if ok {
					require.Equal(t, string(in), string(out), what)
				}
			}
		}
	}
}

// TestCanonicalJSONManyNames: objects with hundreds of members, whose
// names the case-folding check sorts rather than compares pairwise, are
// refused when two names fold alike and put in order when none do.
func TestCanonicalJSONManyNames(t *testing.T) {
	object := func(names ...string) string {
		var b strings.Builder
		b.WriteByte('{')
		for k, name := range names {
			if k > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%q:%d", name, k)
		}
		return b.String() + "}"
	}
	var lower, upper []string
	for k := 299; k >= 0; k-- {
		lower = append(lower, fmt.Sprintf("k%03d", k))
		upper = append(upper, fmt.Sprintf("K%03d", k))
	}
	for _, names := range [][]string{slices.Concat(lower, []string{"K000"}), slices.Concat(lower, []string{"\u00e9", "\u00c9"}), slices.Concat(upper[:150], lower[:150])} {
		in := object(names...)
		_, ok := canon(t, in)
		require.False(t, ok, "%.60s…", in)
		require.True(t, duplicateNames([]byte(in)), "%.60s…: the test's own detector agrees", in)
	}
	for _, names := range [][]string{upper, slices.Concat(upper[:150], lower[150:]), slices.Concat(lower, []string{"K300", "\u00e9"})} {
		in := object(names...)
		want, err := stdlibCanonical([]byte(in))
		require.NoError(t, err)
		got, ok := canon(t, in)
		require.True(t, ok, "%.60s…", in)
		require.Equal(t, string(want), got)
	}
}

// TestCanonicalJSONManyNamesScale: the case-folding check of an object's
// names costs about what sorting them costs, not the square of their
// number: ten times the names cost about ten times the time.
func TestCanonicalJSONManyNamesScale(t *testing.T) {
	object := func(n int) []byte {
		b := []byte{'{'}
		for k := range n {
			if k > 0 {
				b = append(b, ',')
			}
			b = fmt.Appendf(b, `"Name%05d":0`, k)
		}
		return append(b, '}')
	}
	fastest := func(src []byte) time.Duration {
		best := time.Hour
		var c Canonicalizer
		for range 3 {
			start := time.Now()
			c.src = src
			out, ok := c.run()
			best = min(best, time.Since(start))
			require.True(t, ok)
			c.Reset(out)
		}
		return best
	}
	small, large := fastest(object(1000)), fastest(object(10000))
	t.Logf("1,000 names: %v; 10,000 names: %v", small, large)
	require.Less(t, large, 40*small+20*time.Millisecond, "quadratic in the number of names")
}

// TestCanonicalizerSmall: Small keeps a Canonicalizer for reuse while each
// of its buffers is within its share of limit, at the bound included.
func TestCanonicalizerSmall(t *testing.T) {
	const limit = 4096
	require.True(t, new(Canonicalizer).Small(0), "nothing grown yet")
	for _, tc := range []struct {
		name  string
		bound int
		grow  func(c *Canonicalizer, n int)
	}{
		{"dst", limit, func(c *Canonicalizer, n int) { c.dst = make([]byte, 0, n) }},
		{"tmp", limit, func(c *Canonicalizer, n int) { c.tmp = make([]byte, 0, n) }},
		{"members", limit / 32, func(c *Canonicalizer, n int) { c.members = make([]member, 0, n) }},
		{"objs", limit / 64, func(c *Canonicalizer, n int) { c.objs = make([]reorder, 0, n) }},
		{"sorted", limit / 32, func(c *Canonicalizer, n int) { c.sorted = make([]member, 0, n) }},
		{"folds", limit / 32, func(c *Canonicalizer, n int) { c.folds = make([]member, 0, n) }},
		{"tops", limit / 8, func(c *Canonicalizer, n int) { c.tops = make([]int, 0, n) }},
	} {
		var c Canonicalizer
		tc.grow(&c, tc.bound)
		require.True(t, c.Small(limit), "%s at its bound", tc.name)
		tc.grow(&c, tc.bound+1)
		require.False(t, c.Small(limit), "%s past its bound", tc.name)
	}
}

// TestCanonicalizerReuse: a Canonicalizer reused as the fingerprints reuse
// it (Buffer, Append, Reset) gives Append's result and, once its buffers
// have grown, allocates nothing, even for a text whose objects wait for the
// final pass; Buffer returns its buffer again while it has room.
func TestCanonicalizerReuse(t *testing.T) {
	var c Canonicalizer
	b := c.Buffer(100)
	require.Empty(t, b)
	require.GreaterOrEqual(t, cap(b), 100)
	require.Equal(t, unsafe.SliceData(b), unsafe.SliceData(c.Buffer(100)), "room enough: the same buffer")
	require.Equal(t, unsafe.SliceData(b), unsafe.SliceData(c.Buffer(10)), "room enough: the same buffer")
	require.GreaterOrEqual(t, cap(c.Buffer(1000)), 1000)

	for _, src := range [][]byte{
		deepJSON(30, 3000), // out of order at every level: most objects wait for the final pass
		[]byte(`{"c":{"f":{"h":1,"g":2},"e":[{"j":1,"i":{"l":1,"k":2}}]},"b":{"d":1},"a":[{"y":1,"x":2},{"w":1}]}`),
		[]byte(`[{"a":[1,2],"b":{"c":true,"d":null}},"x"]`), // in order
	} {
		want, ok := appendBounded(t, nil, src)
		require.True(t, ok)
		var c Canonicalizer
		run := func() {
			out, ok := c.Append(c.Buffer(len(src)), src)
			if !ok || string(out) != string(want) {
				t.Fatalf("reused: %q, %v; want %q", out, ok, want)
			}
			c.Reset(out)
		}
		run()
		run()
		require.Zero(t, testing.AllocsPerRun(20, run), "%.40s…", src)
		require.True(t, c.Small(4*len(src)), "its buffers grew with the text")
	}
}
