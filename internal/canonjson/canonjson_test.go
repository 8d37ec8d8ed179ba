package canonjson

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// Inputs of the canonicaliser benchmarks and tests.
var (
	// canonSmall is the benchmark body as a JavaScript client orders it.
	canonSmall  = []byte(`{"description": "order 1042", "customer": "cus_4QFJ", "currency": "EUR", "amount": 1000}`)
	canonMedium = mediumJSON(50)
	canonDeep   = deepJSON(maxJSONDepth-1, 1<<20)
)

// mediumJSON returns an array of n unsorted objects with nested objects,
// arrays, numbers, escaped strings and camelCase names: about 270 bytes
// each.
func mediumJSON(n int) []byte {
	var b bytes.Buffer
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteString(",\n")
		}
		fmt.Fprintf(&b, `{"type": "payment", "id": "pay_%06d", "amount": %d.%02d, "meta": {"tags": ["a", "b\u00e9"], "note": "line\nbreak \"q\""},`+
			` "customer": {"name": "Zo\u00eb %d", "email": "c%d@example.com", "address": {"zip": "75001", "city": "Paris"}},`+
			` "createdAt": "2026-01-02T03:04:05Z", "customerId": "cus_%d", "ok": true, "n": null}`,
			i, i*37, i%100, i, i, i)
	}
	b.WriteByte(']')
	return b.Bytes()
}

// deepJSON returns about size bytes of objects nested depth levels deep,
// each with its members out of order: {"z":"…","a":{"z":"…","a":…}}.
func deepJSON(depth, size int) []byte {
	pad := deepPad(depth, size)
	b := make([]byte, 0, depth*(len(pad)+13)+4)
	for range depth {
		b = append(b, `{"z":"`...)
		b = append(b, pad...)
		b = append(b, `","a":`...)
	}
	b = append(b, "null"...)
	for range depth {
		b = append(b, '}')
	}
	return b
}

// deepPad is the string of each level of deepJSON(depth, size).
func deepPad(depth, size int) string {
	return strings.Repeat("p", max(size/depth-len(`{"z":"","a":}`), 0))
}

// stdlibCanonical is canonicalisation done with encoding/json: decode with
// UseNumber, encode (maps come out with their keys sorted).
func stdlibCanonical(src []byte) ([]byte, error) {
	var v any
	if err := unmarshalNumbers(src, &v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// BenchmarkCanonicalJSON compares the canonicaliser with the one it
// replaced and with encoding/json on the same inputs: decoding and
// re-encoding (what canonicalising with encoding/json costs), and
// json.Valid (the least any parser does).
func BenchmarkCanonicalJSON(b *testing.B) {
	for _, in := range []struct {
		name string
		src  []byte
	}{{"small", canonSmall}, {"medium", canonMedium}, {"deep", canonDeep}} {
		b.Run(in.name+"/idem", func(b *testing.B) {
			b.SetBytes(int64(len(in.src)))
			b.ReportAllocs()
			var c Canonicalizer
			for b.Loop() {
				c.src, c.i = in.src, 0
				out, ok := c.run()
				if !ok {
					b.Fatal("not canonicalised")
				}
				c.Reset(out)
			}
		})
		b.Run(in.name+"/before", func(b *testing.B) { // the canonicaliser this one replaced
			b.SetBytes(int64(len(in.src)))
			b.ReportAllocs()
			var c oracleCanonicalizer
			for b.Loop() {
				c.src, c.i = in.src, 0
				out, ok := c.run()
				if !ok {
					b.Fatal("not canonicalised")
				}
				c.dst, c.members = out[:0], c.members[:0]
			}
		})
		b.Run(in.name+"/encoding-json", func(b *testing.B) {
			b.SetBytes(int64(len(in.src)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := stdlibCanonical(in.src); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(in.name+"/json-Valid", func(b *testing.B) {
			b.SetBytes(int64(len(in.src)))
			for b.Loop() {
				if !json.Valid(in.src) {
					b.Fatal("invalid")
				}
			}
		})
	}
}

func canon(t testing.TB, s string) (string, bool) {
	t.Helper()
	out, ok := appendBounded(t, nil, []byte(s))
	return string(out), ok
}

func TestCanonicalJSON(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{" {\n\t\"b\" : [ 1 , 2 ] ,\r\n \"a\" : { \"d\":null, \"c\":true } } ", `{"a":{"c":true,"d":null},"b":[1,2]}`},
		{`{"a":1.0,"b":1e3,"c":-0,"d":0.5E-2}`, `{"a":1.0,"b":1e3,"c":-0,"d":0.5E-2}`},
		{`"\u0041\/\"\\\n\u001f\u00e9\ud83d\ude00"`, "\"A/\\\"\\\\\\n\\u001f\u00e9\U0001F600\""},
		{`"\ud800x"`, `"\ud800x"`},
		{`"\uD800\uDBFF"`, `"\ud800\udbff"`},
		{`{"\u0062":1,"a":2}`, `{"a":2,"b":1}`},
		{`[]`, `[]`},
		{`{}`, `{}`},
		{` 7 `, `7`},
		{`[{"z":{"y":[{"b":1,"a":2}]},"x":0}]`, `[{"x":0,"z":{"y":[{"a":2,"b":1}]}}]`},
		{`{"c":{"f":{"h":1,"g":2},"e":[{"j":1,"i":{"l":1,"k":2}}]},"b":{"d":1},"a":[{"y":1,"x":2},{"w":1}]}`,
			`{"a":[{"x":2,"y":1},{"w":1}],"b":{"d":1},"c":{"e":[{"i":{"k":2,"l":1},"j":1}],"f":{"g":2,"h":1}}}`},
		{`{"b":1,"C":2,"a":3}`, `{"C":2,"a":3,"b":1}`},
	} {
		got, ok := canon(t, tc.in)
		require.True(t, ok, tc.in)
		require.Equal(t, tc.want, got, tc.in)
	}
	for _, bad := range []string{``, ` `, `{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `[1 2]`, `01`, `1.`, `.5`, `-`, `1e`, `+1`,
		`tru`, `nul`, `"a`, "\"a\x01\"", `"\x"`, `"\u12"`, `{"a":1}x`, `{a:1}`, `NaN`, `[` + strings.Repeat("[", maxJSONDepth+1)} {
		_, ok := canon(t, bad)
		require.False(t, ok, "%q", bad)
	}
}

// TestCanonicalJSONDuplicateNames: an object with two members that a
// decoder may take for one has no canonical form (the middleware then
// compares the body byte for byte), so {"amount":1,"amount":1000} and
// {"amount":1000,"amount":1}, which encoding/json decodes differently,
// never share a fingerprint.
func TestCanonicalJSONDuplicateNames(t *testing.T) {
	for _, in := range []string{
		`{"amount":1,"amount":1000}`,
		`{"amount":1000,"amount":1}`,
		`{"a":1,"b":2,"a":1}`,
		`{"b":0,"a":1,"c":2,"a":3}`,
		`{"\u0061":1,"a":2}`,
		`[{"x":{"a":1,"a":1}}]`,
		// encoding/json matches struct fields without regard to case.
		`{"amount":1,"Amount":1000}`,
		`{"AMOUNT":1,"b":0,"amount":1000}`,
		"{\"k\":1,\"\u212a\":2}", // the Kelvin sign folds to k
		"{\"s\":1,\"\u017f\":2}", // so does ſ to s
		`{"é":1,"É":2}`,
		// encoding/json decodes invalid UTF-8 and lone surrogates to U+FFFD.
		"{\"\xff\":1,\"\xfe\":2}",
		`{"\ud800":1,"\udbff":2}`,
		"{\"\ufffd\":1,\"\\udfff\":2}",
	} {
		_, ok := canon(t, in)
		require.False(t, ok, "%q", in)
		require.True(t, duplicateNames([]byte(in)), "%q: the test's own detector agrees", in)
	}
	for _, in := range []string{`{"a":1,"b":{"a":1}}`, `{"a":[{"a":1},{"a":2}]}`, `{"ab":1,"a":2,"b":3}`, `{"a_b":1,"a-b":2}`} {
		_, ok := canon(t, in)
		require.True(t, ok, "%q: equal names in different objects are fine", in)
	}
}

// duplicateNames reports whether an object of the valid JSON text in has
// two names that encoding/json decodes to strings equal without regard to
// case: the test's own detector, through encoding/json's tokenizer.
func duplicateNames(in []byte) bool {
	d := json.NewDecoder(bytes.NewReader(in))
	d.UseNumber()
	type frame struct {
		object bool
		names  []string
		key    bool // the next string is a name
	}
	var stack []*frame
	for {
		tok, err := d.Token()
		if err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch tok := tok.(type) {
		case json.Delim:
			switch tok {
			case '{', '[':
				if top != nil && top.object {
					top.key = true
				}
				stack = append(stack, &frame{object: tok == '{', key: tok == '{'})
			default:
				stack = stack[:len(stack)-1]
			}
			continue
		case string:
			if top != nil && top.object && top.key {
				for _, n := range top.names {
					if strings.EqualFold(n, tok) {
						return true
					}
				}
				top.names = append(top.names, tok)
				top.key = false
				continue
			}
		}
		if top != nil && top.object {
			top.key = true
		}
	}
}

// FuzzCanonicalJSON checks Append against encoding/json: it accepts
// exactly the valid documents without duplicate names, its output is valid
// and stable, and documents that decode to equal values have one canonical
// form.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[true,null,"x"]}`, `"\u00e9\ud83d\ude00\/"`, `[1.50,-0e+1]`, `{"a":{"a":{}}}`, `  12 `,
		`{"a":1,"a":2}`, `{"amount":1,"Amount":2}`, `{"\ud800":1,"\udfff":2}`, "{\"k\":1,\"\u212a\":2}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, ok := appendBounded(t, nil, in)
		valid := json.Valid(in)
		require.Equal(t, valid && !duplicateNames(in), ok, "%q", in)
		if !ok {
			return
		}
		require.True(t, json.Valid(out), "%q -> %q", in, out)
		again, ok := appendBounded(t, nil, out)
		require.True(t, ok)
		require.Equal(t, string(out), string(again), "canonical form is stable")

		// encoding/json replaces invalid UTF-8 and lone surrogates: it is
		// the reference only without them.
		if !utf8.Valid(in) || bytes.Contains(bytes.ToLower(in), []byte(`\ud`)) {
			return
		}
		var v any
		require.NoError(t, unmarshalNumbers(in, &v))
		re, err := json.Marshal(v)
		require.NoError(t, err)
		viaStdlib, ok := appendBounded(t, nil, re)
		require.True(t, ok)
		require.Equal(t, string(out), string(viaStdlib), "%q", in)
	})
}

// FuzzCanonicalJSONMatchesOracle compares the canonicaliser with the one it
// replaced (oracle_test.go) on inputs the oracle handles
// quickly: the output is the same, so fingerprints stored before the
// rewrite still match, except for documents with duplicate names, which
// have no canonical form any more.
func FuzzCanonicalJSONMatchesOracle(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[true,null,"x"]}`, `[{"z":{"y":[{"b":1,"a":2}]},"x":0}]`, `{"a":1,"a":2}`,
		`{"c":{"f":{"h":1,"g":2},"e":[{"j":1,"i":{"l":1,"k":2}}]},"b":{"d":1},"a":[{"y":1,"x":2},{"w":1}]}`,
		`{"B":1,"b":2}`, `{"\u00e9":{"\u00c9":[]},"e":"\ud800"}`, `[[{"b":{"d":0,"c":1},"a":0}],{"b":[],"a":{}}]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if nesting(in) > 64 {
			return // the oracle's cost grows with depth times size
		}
		want, wantOK := oracleCanonicalJSON([]byte("head"), in)
		got, ok := appendBounded(t, []byte("head"), in)
		switch {
		case ok:
			require.True(t, wantOK, "%q", in)
			require.Equal(t, string(want), string(got), "%q", in)
		case wantOK:
			require.True(t, duplicateNames(in), "%q: refused, yet the oracle canonicalised it and it has no duplicate names", in)
		}
	})
}

// nesting returns how deep brackets nest in b, strings ignored or not.
func nesting(b []byte) int {
	depth, deepest := 0, 0
	for _, c := range b {
		switch c {
		case '{', '[':
			depth++
			deepest = max(deepest, depth)
		case '}', ']':
			depth--
		}
	}
	return deepest
}

// TestCanonicalJSONIsLinear: a megabyte of objects nested 10,000 deep, each
// out of order, costs about what the same bytes cost side by side (it cost
// depth/2 times more when every level rewrote its subtree).
func TestCanonicalJSONIsLinear(t *testing.T) {
	flat := bytes.Repeat([]byte(`{"z":"`+strings.Repeat("p", 92)+`","a":null},`), maxJSONDepth-1)
	flat = append(append([]byte{'['}, flat[:len(flat)-1]...), ']')
	fastest := func(src []byte) time.Duration {
		best := time.Hour
		var c Canonicalizer
		for range 5 {
			start := time.Now()
			c.src = src
			out, ok := c.run()
			best = min(best, time.Since(start))
			require.True(t, ok)
			c.Reset(out)
		}
		return best
	}
	for _, src := range [][]byte{canonDeep, flat} { // it returns at all, before it is timed
		_, ok := appendBounded(t, nil, src)
		require.True(t, ok)
	}
	deep, side := fastest(canonDeep), fastest(flat)
	t.Logf("%d bytes %d deep: %v; %d bytes side by side: %v", len(canonDeep), maxJSONDepth-1, deep, len(flat), side)
	require.Less(t, deep, 20*side+50*time.Millisecond)
}

// unmarshalNumbers decodes JSON keeping numbers as written.
func unmarshalNumbers(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	return d.Decode(v)
}

// TestCanonicalJSONPrefixes: every prefix of documents that hold each kind
// of value (escapes, \u sequences and surrogates, numbers with fractions
// and exponents, objects out of order, names equal once case-folded) is
// canonicalised as the oracle does, or refused where the oracle refuses it
// or the names are ambiguous: the inputs that end at each byte, which
// FuzzCanonicalJSONMatchesOracle finds only by chance.
func TestCanonicalJSONPrefixes(t *testing.T) {
	for _, doc := range []string{
		`{"b":1,"a":[true,null,false,"x\"y\\z\/\b\f\n\r\t"],"c":-0.5e+10}`,
		` [ {"z":{"y":[{"b":1,"a":2}]},"x":0} , 1E-3 , 10 ] `,
		`{"\u00e9":{"\u00c9":[]},"e":"\ud83d\ude00\u0041","E":2}`,
		`{"K":1,"k":{"b":"\u212a","a":"\u017f"}}`,
		`{"aa":{},"a":[],"ab":"","A":0}`,
		`["\u0020\u001f\u007f\u0000", "a\u0020b"]`,
	} {
		for n := 0; n <= len(doc); n++ {
			in := []byte(doc[:n])
			want, wantOK := oracleCanonicalJSON([]byte("head"), in)
			got, ok := appendBounded(t, []byte("head"), in)
			switch {
			case ok:
				require.True(t, wantOK, "%q", in)
				require.Equal(t, string(want), string(got), "%q", in)
			case wantOK:
				require.True(t, duplicateNames(in), "%q: refused, yet the oracle canonicalised it and it has no duplicate names", in)
			}
		}
	}
}
