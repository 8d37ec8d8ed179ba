// Code copied from canonjson.go (then canonical_json.go) as it was before the linear rewrite
// (issue 9): the oracle that FuzzCanonicalJSONMatchesOracle compares the new
// canonicaliser with. Do not change it.

package canonjson

import (
	"bytes"
	"slices"
	"unicode/utf16"
	"unicode/utf8"
)

// oracleMaxDepth bounds the nesting oracleCanonicalJSON accepts, as encoding/json does.
const oracleMaxDepth = 10000

// oracleCanonicalJSON appends to dst the canonical form of the JSON text src and
// reports whether src is exactly one JSON value. The canonical form has no
// insignificant whitespace, object members sorted by key (members with equal
// keys by value), strings with only the escapes JSON requires (", \ and
// control characters, the short forms where they exist), and numbers as
// written. Two texts that encoding/json with UseNumber decodes to equal
// values without duplicate keys have one canonical form.
func oracleCanonicalJSON(dst, src []byte) ([]byte, bool) {
	c := oracleCanonicalizer{src: src, dst: dst}
	return c.run()
}

func (c *oracleCanonicalizer) run() ([]byte, bool) {
	dst := c.dst
	c.space()
	if !c.value(0) {
		return dst, false
	}
	c.space()
	return c.dst, c.i == len(c.src)
}

type oracleCanonicalizer struct {
	src, dst []byte
	i        int
	members  []oracleMember // a stack: the members of the objects being parsed
	tmp      []byte
	dupKeys  bool // an object had two members with one key (for tests)
}

// oracleMember is an object oracleMember written at dst[start:end], its key (with
// quotes) ending at keyEnd.
type oracleMember struct{ start, keyEnd, end int }

func (c *oracleCanonicalizer) space() {
	for c.i < len(c.src) {
		switch c.src[c.i] {
		case ' ', '\t', '\n', '\r':
			c.i++
		default:
			return
		}
	}
}

func (c *oracleCanonicalizer) value(depth int) bool {
	if c.i >= len(c.src) || depth > oracleMaxDepth {
		return false
	}
	switch c.src[c.i] {
	case '{':
		return c.object(depth)
	case '[':
		return c.array(depth)
	case '"':
		return c.str()
	case 't':
		return c.literal("true")
	case 'f':
		return c.literal("false")
	case 'n':
		return c.literal("null")
	}
	return c.number()
}

func (c *oracleCanonicalizer) literal(s string) bool {
	if !bytes.HasPrefix(c.src[c.i:], []byte(s)) {
		return false
	}
	c.i += len(s)
	c.dst = append(c.dst, s...)
	return true
}

func (c *oracleCanonicalizer) array(depth int) bool {
	c.i++
	c.dst = append(c.dst, '[')
	c.space()
	if c.i < len(c.src) && c.src[c.i] == ']' {
		c.i++
		c.dst = append(c.dst, ']')
		return true
	}
	for {
		c.space()
		if !c.value(depth + 1) {
			return false
		}
		c.space()
		if c.i >= len(c.src) {
			return false
		}
		switch c.src[c.i] {
		case ',':
			c.i++
			c.dst = append(c.dst, ',')
		case ']':
			c.i++
			c.dst = append(c.dst, ']')
			return true
		default:
			return false
		}
	}
}

func (c *oracleCanonicalizer) object(depth int) bool {
	c.i++
	c.dst = append(c.dst, '{')
	start := len(c.dst)
	base := len(c.members)
	defer func() { c.members = c.members[:base] }()
	c.space()
	if c.i < len(c.src) && c.src[c.i] == '}' {
		c.i++
		c.dst = append(c.dst, '}')
		return true
	}
	for {
		c.space()
		if c.i >= len(c.src) || c.src[c.i] != '"' {
			return false
		}
		m := oracleMember{start: len(c.dst)}
		if !c.str() {
			return false
		}
		m.keyEnd = len(c.dst)
		c.space()
		if c.i >= len(c.src) || c.src[c.i] != ':' {
			return false
		}
		c.i++
		c.dst = append(c.dst, ':')
		c.space()
		if !c.value(depth + 1) {
			return false
		}
		m.end = len(c.dst)
		c.members = append(c.members, m)
		c.space()
		if c.i >= len(c.src) {
			return false
		}
		if c.src[c.i] == '}' {
			c.i++
			break
		}
		if c.src[c.i] != ',' {
			return false
		}
		c.i++
		c.dst = append(c.dst, ',')
	}
	ms := c.members[base:]
	if !slices.IsSortedFunc(ms, c.compare) {
		// Rewrite the members in order, from a copy.
		c.tmp = append(c.tmp[:0], c.dst[start:]...)
		slices.SortFunc(ms, c.compare)
		c.dst = c.dst[:start]
		for k, m := range ms {
			if k > 0 {
				c.dst = append(c.dst, ',')
			}
			c.dst = append(c.dst, c.tmp[m.start-start:m.end-start]...)
		}
	}
	for k := 1; k < len(ms) && !c.dupKeys; k++ {
		c.dupKeys = bytes.Equal(c.key(ms[k-1]), c.key(ms[k]))
	}
	c.dst = append(c.dst, '}')
	return true
}

// key returns m's key without its quotes.
func (c *oracleCanonicalizer) key(m oracleMember) []byte { return c.dst[m.start+1 : m.keyEnd-1] }

// compare orders members by key, then by value.
func (c *oracleCanonicalizer) compare(a, b oracleMember) int {
	if k := bytes.Compare(c.key(a), c.key(b)); k != 0 {
		return k
	}
	return bytes.Compare(c.dst[a.keyEnd:a.end], c.dst[b.keyEnd:b.end])
}

// str copies a string in canonical form: the escapes decoded, then only ",
// \ and control characters escaped.
func (c *oracleCanonicalizer) str() bool {
	c.i++ // opening quote
	c.dst = append(c.dst, '"')
	for c.i < len(c.src) {
		// Copy the run of plain bytes.
		j := c.i
		for j < len(c.src) && c.src[j] != '"' && c.src[j] != '\\' && c.src[j] >= 0x20 {
			j++
		}
		c.dst = append(c.dst, c.src[c.i:j]...)
		c.i = j
		if j == len(c.src) || c.src[j] < 0x20 {
			return false
		}
		if c.src[j] == '"' {
			c.i++
			c.dst = append(c.dst, '"')
			return true
		}
		// An escape.
		if j+1 >= len(c.src) {
			return false
		}
		e := c.src[j+1]
		c.i = j + 2
		switch e {
		case '"', '\\':
			c.dst = append(c.dst, '\\', e)
		case '/':
			c.dst = append(c.dst, '/')
		case 'b', 'f', 'n', 'r', 't':
			c.dst = append(c.dst, '\\', e)
		case 'u':
			r, ok := c.hex4(c.i)
			if !ok {
				return false
			}
			c.i += 4
			if utf16.IsSurrogate(r) {
				if r2, ok := c.lowSurrogate(); ok {
					if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
						c.i += 6
						c.dst = utf8.AppendRune(c.dst, d)
						continue
					}
				}
				// A lone surrogate stays escaped: it has no UTF-8 form.
				c.dst = append(c.dst, '\\', 'u', oracleHexDigit(r>>12), oracleHexDigit(r>>8), oracleHexDigit(r>>4), oracleHexDigit(r))
				continue
			}
			c.appendRune(r)
		default:
			return false
		}
	}
	return false
}

// lowSurrogate returns the \uXXXX escape at c.i, if there is one.
func (c *oracleCanonicalizer) lowSurrogate() (rune, bool) {
	if c.i+6 > len(c.src) || c.src[c.i] != '\\' || c.src[c.i+1] != 'u' {
		return 0, false
	}
	return c.hex4(c.i + 2)
}

// appendRune writes a decoded \u escape in canonical form.
func (c *oracleCanonicalizer) appendRune(r rune) {
	switch r {
	case '"', '\\':
		c.dst = append(c.dst, '\\', byte(r))
	case '\b':
		c.dst = append(c.dst, '\\', 'b')
	case '\f':
		c.dst = append(c.dst, '\\', 'f')
	case '\n':
		c.dst = append(c.dst, '\\', 'n')
	case '\r':
		c.dst = append(c.dst, '\\', 'r')
	case '\t':
		c.dst = append(c.dst, '\\', 't')
	default:
		if r < 0x20 {
			c.dst = append(c.dst, '\\', 'u', '0', '0', oracleHexDigit(r>>4), oracleHexDigit(r))
			return
		}
		c.dst = utf8.AppendRune(c.dst, r)
	}
}

func (c *oracleCanonicalizer) hex4(i int) (rune, bool) {
	if i+4 > len(c.src) {
		return 0, false
	}
	var r rune
	for _, h := range c.src[i : i+4] {
		switch {
		case '0' <= h && h <= '9':
			h -= '0'
		case 'a' <= h && h <= 'f':
			h -= 'a' - 10
		case 'A' <= h && h <= 'F':
			h -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(h)
	}
	return r, true
}

func oracleHexDigit(r rune) byte { return "0123456789abcdef"[r&0xf] }

// number copies a number as written, after checking its grammar:
// -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
func (c *oracleCanonicalizer) number() bool {
	s, i := c.src, c.i
	digits := func() bool {
		j := i
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
		return i > j
	}
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case !digits():
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if !digits() {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if !digits() {
			return false
		}
	}
	c.dst = append(c.dst, s[c.i:i]...)
	c.i = i
	return true
}
