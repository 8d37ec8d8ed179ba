package canonjson

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// This file checks the canonical form piece by piece: strings, numbers,
// the order of names, the names a decoder takes for one, and the order of
// objects nested deeper than the first pass puts in order.

// TestCanonicalJSONStrings: the bytes of a string that need no escape,
// space and every other printable ASCII byte included, are copied as they
// are; the escapes JSON requires stay escaped, in their short form where
// there is one; the others are decoded.
func TestCanonicalJSONStrings(t *testing.T) {
	var printable strings.Builder
	for b := byte(' '); b <= '~'; b++ {
		if b != '"' && b != '\\' {
			printable.WriteByte(b)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{`"` + printable.String() + `"`, `"` + printable.String() + `"`},
		{`{"a b":" x ","!":"~"}`, `{"!":"~","a b":" x "}`},
		{"\"\u007f\u00a0\u2028\U0001F600\"", "\"\u007f\u00a0\u2028\U0001F600\""},
		{`"\u0022\u005c\u002f\u0008\u000c\u000a\u000d\u0009\u0000\u0020"`, `"\"\\/\b\f\n\r\t\u0000 "`},
		{`"\"\\\/\b\f\n\r\t"`, `"\"\\/\b\f\n\r\t"`},
		{`"\u00E9\u00e9\uFFFF"`, "\"\u00e9\u00e9\uffff\""},
		{`"\uD83D\uDE00 \udbff\udfff"`, "\"\U0001F600 \U0010FFFF\""},
		{`"\ude00\ud83d"`, `"\ude00\ud83d"`}, // a low surrogate first is two lone ones
		{`"\ud83d\u0041"`, `"\ud83dA"`},      // a high one before another escape
		{`"\ud83d\\"`, `"\ud83d\\"`},
	} {
		got, ok := canon(t, tc.in)
		require.True(t, ok, "%q", tc.in)
		require.Equal(t, tc.want, got, "%q", tc.in)
	}
	for _, bad := range []string{"\"a\x1fb\"", "\"\x00\"", "\"\t\"", `"\a"`, `"\U0041"`, `"\u00g0"`, `"\ud83d\u"`, `"\ud83d\ude0"`, `"\`, `"\u0041`} {
		_, ok := canon(t, bad)
		require.False(t, ok, "%q", bad)
	}
}

// TestCanonicalJSONNumbers: numbers are copied as written, every digit of
// them, once their grammar is checked.
func TestCanonicalJSONNumbers(t *testing.T) {
	for _, n := range []string{`0`, `-0`, `1234567890`, `-9876543210`, `0.0123456789`, `9.99e+99`, `-1E-9`, `19e09`, `0e0`,
		`100000000000000000000000000000001`} {
		got, ok := canon(t, " "+n+" ")
		require.True(t, ok, n)
		require.Equal(t, n, got)
		got, ok = canon(t, `[`+n+`,`+n+`]`)
		require.True(t, ok, n)
		require.Equal(t, `[`+n+`,`+n+`]`, got)
	}
	for _, bad := range []string{`00`, `-01`, `1.e5`, `1e+`, `1e-`, `--1`, `-a`, `0x1`, `1.5.`, `9.`, `-`, `- 1`, `1_000`, `Infinity`} {
		_, ok := canon(t, bad)
		require.False(t, ok, "%q", bad)
	}
}

// TestCanonicalJSONNameOrder: members are ordered by the bytes of their
// names in canonical form, a name before the longer names it begins,
// whatever byte follows (the lowest a name may hold is the space).
func TestCanonicalJSONNameOrder(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"a!":1,"a ":2,"a":3}`, `{"a":3,"a ":2,"a!":1}`},
		{`{"ab":1,"a":2,"":3}`, `{"":3,"a":2,"ab":1}`},
		{`{"a\"":1,"a\\":2,"a~":3,"a":4}`, `{"a":4,"a\"":1,"a\\":2,"a~":3}`},
		{`{"\u00e9":1,"z":2,"\u00e9 ":3}`, "{\"z\":2,\"\u00e9\":1,\"\u00e9 \":3}"},
		{`[{"b":[{"d":1,"c":2}],"a":{"f":1,"e":2}}]`, `[{"a":{"e":2,"f":1},"b":[{"c":2,"d":1}]}]`},
	} {
		got, ok := canon(t, tc.in)
		require.True(t, ok, tc.in)
		require.Equal(t, tc.want, got, tc.in)
		want, wantOK := oracleCanonicalJSON(nil, []byte(tc.in))
		require.True(t, wantOK)
		require.Equal(t, string(want), got, "the canonicaliser Append replaced orders them so: %s", tc.in)
	}
}

// TestCanonicalJSONFoldedNames: names equal once decoded and case-folded as
// encoding/json matches struct fields, at either end of the alphabet, with
// non-ASCII letters and invalid bytes too, have no canonical form; names
// that only begin alike, or that are written alike but decode apart, do.
func TestCanonicalJSONFoldedNames(t *testing.T) {
	for _, doc := range []string{`{"a":1,"A":2}`, `{"z":1,"Z":2}`, `{"xa":1,"XA":2}`, `{"A":1,"b":2,"a":3}`,
		`{"a\u00e9":1,"A\u00e9":2}`, `{"z\u00e9":1,"Z\u00c9":2}`, "{\"\u00e9a\":1,\"\u00c9A\":2}",
		"{\"\x80\":1,\"\xff\":2}", "{\"\x80\":1,\"\\ufffd\":2}", `{"\u001f\u00e9":1,"\u001F\u00c9":2}`} {
		_, ok := canon(t, doc)
		require.False(t, ok, "%q", doc)
		require.True(t, duplicateNames([]byte(doc)), "%q: the test's own detector agrees", doc)
	}
	for _, tc := range []struct{ in, want string }{
		{`{"b":1,"a":2,"@":3,"[":4}`, `{"@":3,"[":4,"a":2,"b":1}`}, // the bytes beside the letters fold to nothing
		{"{\"\u00e9a\":1,\"\u00e9\":2}", "{\"\u00e9\":2,\"\u00e9a\":1}"},
		{"{\"\u00c9\":1,\"\u00e9\u00e9\":2,\"E\":3}", "{\"E\":3,\"\u00c9\":1,\"\u00e9\u00e9\":2}"},
		{`{"\u001f":1,"\\u001f":2}`, `{"\\u001f":2,"\u001f":1}`}, // a control character, and the text of its escape
		{`{"\n":1,"\\n":2,"N":3}`, `{"N":3,"\\n":2,"\n":1}`},
		{"{\"\x80\":1,\"\u0080\":2}", "{\"\x80\":1,\"\u0080\":2}"},
		{"{\"\u4e2d\":1,\"\u4e2d\u6587\":2}", "{\"\u4e2d\":1,\"\u4e2d\u6587\":2}"}, // characters without case
	} {
		got, ok := canon(t, tc.in)
		require.True(t, ok, "%q", tc.in)
		require.Equal(t, tc.want, got, "%q", tc.in)
		require.False(t, duplicateNames([]byte(tc.in)), "%q: the test's own detector agrees", tc.in)
	}
}

// TestCanonicalJSONDeep: objects out of order at every level of a megabyte
// nested as deep as Append allows, most of which the final pass (rewrite)
// puts in order, all come out in order.
func TestCanonicalJSONDeep(t *testing.T) {
	depth := maxJSONDepth - 1
	pad := deepPad(depth, 1<<20)
	want := make([]byte, 0, len(canonDeep))
	for range depth {
		want = append(want, `{"a":`...)
	}
	want = append(want, "null"...)
	for range depth {
		want = append(want, `,"z":"`+pad+`"}`...)
	}
	got, ok := appendBounded(t, []byte("head"), canonDeep)
	require.True(t, ok)
	require.True(t, bytes.Equal(append([]byte("head"), want...), got), "the members of some object are out of order")
}

// TestCanonicalJSONRandomTrees: documents of objects and arrays nested up
// to 40 deep, members out of order at random levels, come out as the
// canonicaliser Append replaced writes them: the first pass and the final
// one (rewrite) share the work at every mix of depths and siblings.
func TestCanonicalJSONRandomTrees(t *testing.T) {
	rng := rand.New(rand.NewPCG(35, 9))
	var gen func(b *strings.Builder, depth int)
	gen = func(b *strings.Builder, depth int) {
		switch k := rng.IntN(10); {
		case depth >= 40 || b.Len() > 4000 || k < 1:
			fmt.Fprintf(b, "%d", rng.IntN(100))
		case k < 3:
			b.WriteByte('[')
			for n := range rng.IntN(3) {
				if n > 0 {
					b.WriteByte(',')
				}
				gen(b, depth+1)
			}
			b.WriteByte(']')
		default:
			b.WriteByte('{')
			names := rng.Perm(5)[:1+rng.IntN(4)] // distinct names, in random order
			for n, name := range names {
				if n > 0 {
					b.WriteByte(',')
				}
				fmt.Fprintf(b, `"%c":`, 'a'+name)
				gen(b, depth+1)
			}
			b.WriteByte('}')
		}
	}
	for range 300 {
		var b strings.Builder
		gen(&b, 0)
		in := []byte(b.String())
		want, wantOK := oracleCanonicalJSON(nil, in)
		require.True(t, wantOK)
		got, ok := appendBounded(t, nil, in)
		require.True(t, ok, "%s", in)
		require.Equal(t, string(want), string(got), "%s", in)
	}
}
