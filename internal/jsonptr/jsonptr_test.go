package jsonptr

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name, in string
		tokens   []string
		err      string
	}{
		{name: "whole document", in: "", tokens: nil},
		{name: "one member", in: "/id", tokens: []string{"id"}},
		{name: "empty name", in: "/", tokens: []string{""}},
		{name: "nested", in: "/data/object/0", tokens: []string{"data", "object", "0"}},
		{name: "escapes", in: "/a~1b/m~0n/~01", tokens: []string{"a/b", "m~n", "~1"}},
		{name: "no slash", in: "id", err: "does not start with /"},
		{name: "bad escape", in: "/a~2", err: "~ must be followed by 0 or 1"},
		{name: "tilde at end", in: "/a~", err: "~ must be followed by 0 or 1"},
		{name: "not UTF-8", in: "/\xff", err: "not UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := parse(t, tt.in)
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.tokens, p.tokens)
			require.Equal(t, tt.in, p.String())
		})
	}
}

func TestFind(t *testing.T) {
	const doc = `{"id": "evt_1", "n": 12.50, "a/b": 1, "m~n": 2, "data": {"object": {"amount": 1000, "items": [{"sku":"x"}, {"sku": "y"}]}}, "s": "}]\"{", "": 3, "deep": [[[]]], "t": true}`
	tests := []struct {
		name, ptr, want string
		kind            Kind
		err             string
	}{
		{name: "whole", ptr: "", want: strings.TrimSpace(doc), kind: Object},
		{name: "string", ptr: "/id", want: `"evt_1"`, kind: String},
		{name: "number as written", ptr: "/n", want: `12.50`, kind: Number},
		{name: "escaped slash", ptr: "/a~1b", want: `1`, kind: Number},
		{name: "escaped tilde", ptr: "/m~0n", want: `2`, kind: Number},
		{name: "empty name", ptr: "/", want: `3`, kind: Number},
		{name: "nested", ptr: "/data/object/amount", want: `1000`, kind: Number},
		{name: "array element", ptr: "/data/object/items/1/sku", want: `"y"`, kind: String},
		{name: "object", ptr: "/data/object/items/0", want: `{"sku":"x"}`, kind: Object},
		{name: "string with brackets", ptr: "/s", want: `"}]\"{"`, kind: String},
		{name: "after the string with brackets", ptr: "/", want: `3`, kind: Number},
		{name: "nested empty arrays", ptr: "/deep/0/0", want: `[]`, kind: Array},
		{name: "boolean", ptr: "/t", want: `true`, kind: Bool},
		{name: "missing member", ptr: "/nope", err: "/nope: no such member"},
		{name: "missing nested", ptr: "/data/nope/x", err: "/data/nope: no such member"},
		{name: "index past end", ptr: "/data/object/items/2", err: "/data/object/items/2: no such element"},
		{name: "dash", ptr: "/data/object/items/-", err: `"-" is not an array index`},
		{name: "leading zero", ptr: "/data/object/items/01", err: "not an array index"},
		{name: "huge index", ptr: "/data/object/items/99999999999999999999999", err: "no such element"},
		{name: "into a scalar", ptr: "/id/x", err: "/id is a string, not an object or array"},
		{name: "into the empty array", ptr: "/deep/0/0/0", err: "no such element"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := parse(t, tt.ptr)
			require.NoError(t, err)
			v, err := find(t, p, []byte(doc))
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, string(v))
			require.Equal(t, tt.kind, KindOf(v))
		})
	}
}

func TestFindAmbiguous(t *testing.T) {
	for _, doc := range []string{
		`{"id": "a", "id": "b"}`,
		`{"id": "a", "ID": "b"}`,
		`{"ID": "a", "id": "b"}`,
		`{"id": "a", "\u0069d": "b"}`,
	} {
		p, _ := parse(t, "/id")
		_, err := find(t, p, []byte(doc))
		require.ErrorContains(t, err, "more than one member", doc)
	}
	// A member differing in case alone is not the one named.
	p, _ := parse(t, "/id")
	_, err := find(t, p, []byte(`{"ID": "a"}`))
	require.ErrorContains(t, err, "no such member")
	// An escaped name is compared once unescaped.
	v, err := find(t, p, []byte(`{"\u0069d": "a", "x": 1}`))
	require.NoError(t, err)
	require.Equal(t, `"a"`, string(v))
}

func TestValid(t *testing.T) {
	require.NoError(t, Valid([]byte(` {"a": [1, "x"]} `)))
	for _, doc := range []string{``, `{`, `{"a":1}x`, `{"a":1,}`, `nope`, `{"a":1} {"b":2}`} {
		require.Error(t, Valid([]byte(doc)), doc)
	}
	deep := []byte(strings.Repeat("[", 20000) + strings.Repeat("]", 20000))
	require.ErrorContains(t, Valid(deep), "depth")
}

// TestFindDeep: a value nested as deep as Valid allows is skipped
// without recursion.
func TestFindDeep(t *testing.T) {
	doc := []byte(`{"x":` + strings.Repeat("[", 9990) + strings.Repeat("]", 9990) + `,"id":"k"}`)
	require.NoError(t, Valid(doc))
	p, _ := parse(t, "/id")
	v, err := find(t, p, doc)
	require.NoError(t, err)
	require.Equal(t, `"k"`, string(v))
}

// FuzzFind compares Find with a walk over the value encoding/json decodes,
// and checks that Find neither panics nor loops on any input.
func FuzzFind(f *testing.F) {
	for _, s := range []struct{ doc, ptr string }{
		{`{"id":"evt_1","data":{"a":[1,2,{"b":null}]}}`, "/data/a/2/b"},
		{`{"a/b":{"m~n":[true]}}`, "/a~1b/m~0n/0"},
		{`{"id":1,"Id":2}`, "/id"},
		{`[0,1,2]`, "/1"},
		{`{"\u0069d":"x"}`, "/id"},
		{`{"s":"\"}]"}`, "/s"},
		{`{"a":1`, "/a"},
		{`[}`, "/3"},
		{`{"a" 1 "b"}`, "/b"},
	} {
		f.Add([]byte(s.doc), s.ptr)
	}
	f.Fuzz(func(t *testing.T, doc []byte, ptr string) {
		p, err := parse(t, ptr)
		if err != nil {
			return
		}
		v, err := find(t, p, doc) // on any input: no panic, no loop
		if Valid(doc) != nil || !utf8.Valid(doc) {
			return // names with invalid UTF-8 are compared as sent, not as decoded
		}
		want, found := oracle(t, doc, p.tokens)
		if err != nil {
			if found && !strings.Contains(err.Error(), "more than one member") {
				t.Fatalf("Find(%q, %q): %v; encoding/json finds %v", doc, ptr, err, want)
			}
			return
		}
		if !found {
			t.Fatalf("Find(%q, %q) = %s; encoding/json finds nothing", doc, ptr, v)
		}
		got := decode(t, v)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Find(%q, %q) = %s; encoding/json finds %v", doc, ptr, v, want)
		}
	})
}

// oracle walks the decoded document by the pointer's tokens.
func oracle(t *testing.T, doc []byte, tokens []string) (any, bool) {
	v := decode(t, doc)
	for _, tok := range tokens {
		switch x := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = x[tok]; !ok {
				return nil, false
			}
		case []any:
			n, err := strconv.Atoi(tok)
			if err != nil || n < 0 || n >= len(x) || strconv.Itoa(n) != tok {
				return nil, false
			}
			v = x[n]
		default:
			return nil, false
		}
	}
	return v, true
}

func decode(t *testing.T, b []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	return v
}

// TestFindTruncated: Find on every prefix of valid documents, under
// pointers that reach into them, neither panics nor loops (the promise
// FuzzFind checks on random input, here on the inputs that end at each
// byte; find bounds each call), and finds nothing in the empty prefix.
func TestFindTruncated(t *testing.T) {
	docs := []string{
		`{"id":"evt_1","data":{"a":[1,2,{"b":null}],"s":"x\"y"},"n":-1.5e3}`,
		`[0,[1,{"k":[true,false]}],"\\"]`,
		` { "a" : { "b" : [ 10 , 20 ] } } `,
	}
	ptrs := []string{"", "/id", "/data/a/2/b", "/data/s", "/n", "/1/1/k/1", "/2", "/a/b/1", "/zz"}
	for _, doc := range docs {
		for _, ptr := range ptrs {
			p, err := parse(t, ptr)
			require.NoError(t, err)
			for n := 0; n <= len(doc); n++ {
				v, err := find(t, p, []byte(doc[:n]))
				if n == 0 && (err == nil || v != nil) {
					t.Fatalf("Find(%q) on nothing = %q, %v", ptr, v, err)
				}
			}
		}
	}
}

// TestFindErrorPaths: an error names the pointer up to the token that
// failed, empty tokens included.
func TestFindErrorPaths(t *testing.T) {
	for _, tc := range []struct{ doc, ptr, err string }{
		{`{"":{"x":1}}`, "//b/c", "//b: no such member"},
		{`{"a":{"":{"x":1}}}`, "/a//b/c", "/a//b: no such member"},
		{`{"a":[1]}`, "/a/1/c", "/a/1"},
	} {
		p, err := parse(t, tc.ptr)
		require.NoError(t, err)
		_, err = find(t, p, []byte(tc.doc))
		require.ErrorContains(t, err, tc.err, "%s in %s", tc.ptr, tc.doc)
	}
}
