// Package jsonptr finds values in JSON texts by JSON Pointer (RFC 6901),
// without decoding the text: Find walks the bytes once, skipping what the
// pointer does not name, so its time is linear in the text and it allocates
// only for a member name written with escapes. Nesting is bounded as
// encoding/json bounds it.
package jsonptr

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Pointer is a parsed JSON Pointer: its reference tokens, unescaped.
type Pointer struct {
	text   string   // as written, for errors
	tokens []string // unescaped
}

// Parse parses a JSON Pointer: "" (the whole text) or a sequence of
// "/token", where "~0" stands for "~" and "~1" for "/" in a token.
func Parse(s string) (Pointer, error) {
	p := Pointer{text: s}
	if s == "" {
		return p, nil
	}
	if s[0] != '/' {
		return p, fmt.Errorf("JSON pointer %q does not start with /", s)
	}
	unescape := strings.NewReplacer("~1", "/", "~0", "~")
	for _, tok := range strings.Split(s[1:], "/") {
		if !utf8.ValidString(tok) {
			return p, fmt.Errorf("JSON pointer %q is not UTF-8", s)
		}
		for j := 0; j < len(tok); j++ {
			if tok[j] == '~' {
				if j+1 == len(tok) || (tok[j+1] != '0' && tok[j+1] != '1') {
					return p, fmt.Errorf("JSON pointer %q: ~ must be followed by 0 or 1", s)
				}
				j++
			}
		}
		p.tokens = append(p.tokens, unescape.Replace(tok))
	}
	return p, nil
}

// String returns the pointer as written.
func (p Pointer) String() string { return p.text }

// Valid returns nil when doc is one JSON text (RFC 8259) nested at most as
// deep as encoding/json accepts, else an error saying where it is not.
func Valid(doc []byte) error {
	if json.Valid(doc) {
		return nil
	}
	var raw json.RawMessage
	err := json.Unmarshal(doc, &raw) // fails in the same check, before copying
	if err == nil {
		err = errors.New("not a JSON text")
	}
	return err
}

// Kind is the kind of a JSON value, by its first byte.
type Kind byte

const (
	Object Kind = '{'
	Array  Kind = '['
	String Kind = '"'
	Number Kind = '0'
	Bool   Kind = 't'
	Null   Kind = 'n'
)

// String names the kind with its article: "an object".
func (k Kind) String() string {
	switch k {
	case Object:
		return "an object"
	case Array:
		return "an array"
	case String:
		return "a string"
	case Number:
		return "a number"
	case Bool:
		return "a boolean"
	}
	return "null"
}

// KindOf returns the kind of the value v, a value Find returned.
func KindOf(v []byte) Kind {
	if len(v) == 0 {
		return Null
	}
	switch c := v[0]; c {
	case '{', '[', '"', 'n':
		return Kind(c)
	case 't', 'f':
		return Bool
	}
	return Number
}

// Find returns the bytes of the value p names in doc, a text that Valid
// accepts (Find does not check it again; on other input its result is
// unspecified, but it neither panics nor loops). An object member is named
// by its exact name; an object holding two members that encoding/json may
// take for the one named (equal, or equal once case-folded, as
// encoding/json matches struct fields) is an error, since decoders differ
// on which one counts. An array element is named by its index in decimal,
// without leading zeros.
func (p Pointer) Find(doc []byte) ([]byte, error) {
	i := space(doc, 0)
	for n, tok := range p.tokens {
		if i >= len(doc) {
			return nil, errors.New("not a JSON text")
		}
		at := Pointer{text: p.prefix(n)}
		var err error
		switch doc[i] {
		case '{':
			i, err = member(doc, i, tok, at, p.prefix(n+1))
		case '[':
			i, err = element(doc, i, tok, p.prefix(n+1))
		default:
			return nil, fmt.Errorf("%s is %s, not an object or array", at.where(), KindOf(doc[i:]))
		}
		if err != nil {
			return nil, err
		}
	}
	if i >= len(doc) {
		return nil, errors.New("not a JSON text")
	}
	return doc[i:skip(doc, i)], nil
}

// prefix returns the pointer made of p's first n tokens, as written.
func (p Pointer) prefix(n int) string {
	s, i := p.text, 0
	for range n {
		j := strings.IndexByte(s[i+1:], '/')
		if j < 0 {
			return s
		}
		i += j + 1
	}
	return s[:i]
}

func (p Pointer) where() string {
	if p.text == "" {
		return "the document"
	}
	return p.text
}

// member returns the position of the value of the member named name in the
// object at doc[i], or an error naming it (path) when there is none or it
// is ambiguous.
func member(doc []byte, i int, name string, at Pointer, path string) (int, error) {
	found, same := -1, 0
	i = space(doc, i+1)
	for i < len(doc) && doc[i] == '"' {
		end := skipString(doc, i)
		if end >= len(doc) {
			break // a name ends no object
		}
		exact, fold := nameMatches(doc[i:end], name)
		i = space(doc, end)
		if i < len(doc) && doc[i] == ':' {
			i = space(doc, i+1)
		}
		if exact {
			found = i
		}
		if fold {
			same++
		}
		i = space(doc, skip(doc, i))
		if i < len(doc) && doc[i] == ',' {
			i = space(doc, i+1)
		}
	}
	switch {
	case same > 1:
		return 0, fmt.Errorf("%s: %s has more than one member named %q (also differing only in case), which decoders read differently", path, at.where(), name)
	case found < 0:
		return 0, fmt.Errorf("%s: no such member", path)
	}
	return found, nil
}

// nameMatches reports whether the member name quoted (as written, quotes
// included) is name, and whether it is name once case-folded.
func nameMatches(quoted []byte, name string) (exact, fold bool) {
	key := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(key, '\\') >= 0 {
		var s string
		if json.Unmarshal(quoted, &s) != nil {
			return false, false
		}
		return s == name, strings.EqualFold(s, name)
	}
	return string(key) == name, bytes.EqualFold(key, []byte(name))
}

// element returns the position of element tok (a decimal index) of the
// array at doc[i].
func element(doc []byte, i int, tok, path string) (int, error) {
	if tok == "" || (tok[0] == '0' && len(tok) > 1) || strings.TrimLeft(tok, "0123456789") != "" {
		return 0, fmt.Errorf("%s: %q is not an array index", path, tok)
	}
	n, err := strconv.Atoi(tok)
	if err != nil {
		return 0, fmt.Errorf("%s: no such element", path)
	}
	i = space(doc, i+1)
	for k := 0; i < len(doc) && doc[i] != ']'; k++ {
		if k == n {
			return i, nil
		}
		i = space(doc, skip(doc, i))
		if i < len(doc) && doc[i] == ',' {
			i = space(doc, i+1)
		}
	}
	return 0, fmt.Errorf("%s: no such element", path)
}

// space returns the position of the first byte at or after i that is not
// whitespace.
func space(doc []byte, i int) int {
	for i < len(doc) {
		switch doc[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// skip returns the position just past the value at doc[i], found by
// counting brackets outside strings: no recursion, however deep the value.
func skip(doc []byte, i int) int {
	if i >= len(doc) {
		return i
	}
	switch doc[i] {
	case '"':
		return skipString(doc, i)
	case '{', '[':
	default: // a number or a literal; at least one byte, so that callers advance
		for i++; i < len(doc); i++ {
			switch doc[i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return i
			}
		}
		return i
	}
	depth := 0
	for i < len(doc) {
		switch doc[i] {
		case '"':
			i = skipString(doc, i)
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
		i++
	}
	return i
}

// skipString returns the position just past the string that opens at
// doc[i] (len(doc) if it does not close).
func skipString(doc []byte, i int) int {
	for i++; i < len(doc); i++ {
		switch doc[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(doc)
}
