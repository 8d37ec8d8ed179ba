// Package canonjson writes JSON texts in canonical form, so that two texts
// that decode to equal values fingerprint equally: no insignificant
// whitespace, object members sorted by name, strings with only the escapes
// JSON requires, numbers as written.
package canonjson

import (
	"bytes"
	"math"
)

// maxJSONDepth bounds the nesting Append accepts, as encoding/json does:
// objects and arrays open at once.
const maxJSONDepth = 10000

// maxMoves bounds how often a byte may be rewritten with the objects out of
// order around it as soon as they are parsed (see place).
const maxMoves = 3

// Append appends to dst the canonical form of the JSON text src and
// reports whether src is exactly one JSON value whose objects have distinct
// member names. The canonical form has no insignificant whitespace, object
// members sorted by name, strings with only the escapes JSON requires (", \
// and control characters, the short forms where they exist), and numbers as
// written. Two texts that encoding/json with UseNumber decodes to equal
// values have one canonical form.
//
// A text with an object whose member names encoding/json may take for one
// (equal once decoded, or once case-folded as encoding/json matches struct
// fields: "amount" and "Amount") has no canonical form: decoders keep the
// last of them or one of them, so reordering such members could change
// what the text means. The caller compares such a text byte for byte.
//
// It runs in time linear in len(src), plus the sorting of each object's
// members: every byte is written once while parsing, and an object out of
// order is rewritten either at once, when nothing inside it waits (see
// place), or in one final pass (rewrite), so that no byte moves more than
// a few times however deep the objects nest.
func Append(dst, src []byte) ([]byte, bool) {
	c := Canonicalizer{src: src, dst: dst}
	return c.run()
}

// Canonicalizer holds the state of one canonicalisation. Its buffers may be
// reused (Reset) for the next.
type Canonicalizer struct {
	src, dst []byte
	i        int
	members  []member  // a stack: the members of the objects being parsed
	objs     []reorder // the objects out of order that wait for rewrite, as they closed
	sorted   []member  // their members, in order (objs[k].m0 to m1)
	folds    []member  // scratch for the case-folding check
	tops     []int     // a stack of indexes in objs, for the rewrite
	tmp      []byte    // the other buffer, for rewriting
	moves    int       // how often the bytes of the last value were rewritten, at most
	dupKeys  bool      // an object had two members that may be taken for one
}

// member is an object member written at dst[start:end], its name (with
// quotes) ending at keyEnd. (Small, for sorting.)
type member struct{ start, keyEnd, end int32 }

// reorder is an object written at dst[open:close+1] whose members are out
// of order: sorted[m0:m1] lists them in order. The objects of
// objs[inner:] up to its own index closed inside it (objs is in closing
// order).
type reorder struct{ open, close, m0, m1, inner int32 }

// run canonicalises c.src after the bytes c.dst holds.
func (c *Canonicalizer) run() ([]byte, bool) {
	dst := c.dst
	if len(c.dst)+len(c.src) > math.MaxInt32 {
		return dst, false // positions are int32; the output is never longer than the input
	}
	c.space()
	if !c.value(0) {
		return dst, false
	}
	c.space()
	if c.i != len(c.src) {
		return dst, false
	}
	if len(c.objs) > 0 {
		c.rewrite()
	}
	return c.dst, true
}

// Append appends to dst the canonical form of src, as the function Append
// does, reusing c's buffers. Once the result is no longer needed, Reset
// takes it back for the next run.
func (c *Canonicalizer) Append(dst, src []byte) ([]byte, bool) {
	c.src, c.dst = src, dst
	return c.run()
}

// Buffer returns c's output buffer, empty, with room for at least n bytes:
// the dst to give Append.
func (c *Canonicalizer) Buffer(n int) []byte {
	if cap(c.dst) < n {
		c.dst = make([]byte, 0, n) // the canonical form is never longer
	}
	return c.dst[:0]
}

// Reset readies c for another run that appends to dst.
func (c *Canonicalizer) Reset(dst []byte) {
	c.src, c.dst, c.i, c.moves, c.dupKeys = nil, dst[:0], 0, 0, false
	c.members, c.objs, c.sorted, c.folds, c.tops = c.members[:0], c.objs[:0], c.sorted[:0], c.folds[:0], c.tops[:0]
}

// Small reports whether c's buffers are small enough to keep for reuse:
// its two text buffers at most limit bytes each, its lists of members at
// most limit/32 entries, its list of objects limit/64 and its stack
// limit/8.
func (c *Canonicalizer) Small(limit int) bool {
	return cap(c.dst) <= limit && cap(c.tmp) <= limit && cap(c.members) <= limit/32 &&
		cap(c.objs) <= limit/64 && cap(c.sorted) <= limit/32 && cap(c.folds) <= limit/32 && cap(c.tops) <= limit/8
}

func (c *Canonicalizer) space() {
	for c.i < len(c.src) {
		switch c.src[c.i] {
		case ' ', '\t', '\n', '\r':
			c.i++
		default:
			return
		}
	}
}

// value copies the value at c.i, inside depth objects and arrays: at most
// maxJSONDepth of them may be open at once, as encoding/json allows.
func (c *Canonicalizer) value(depth int) bool {
	if c.i >= len(c.src) {
		return false
	}
	switch c.src[c.i] {
	case '{':
		return depth < maxJSONDepth && c.object(depth)
	case '[':
		return depth < maxJSONDepth && c.array(depth)
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

func (c *Canonicalizer) literal(s string) bool {
	if !bytes.HasPrefix(c.src[c.i:], []byte(s)) {
		return false
	}
	c.i += len(s)
	c.dst = append(c.dst, s...)
	return true
}

func (c *Canonicalizer) array(depth int) bool {
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

// object copies an object with its members as they come, then puts them in
// order (see place).
func (c *Canonicalizer) object(depth int) bool {
	c.i++
	open := len(c.dst)
	c.dst = append(c.dst, '{')
	inner, outer := len(c.objs), c.moves
	c.moves = 0
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
		m := member{start: int32(len(c.dst))}
		if !c.str() {
			return false
		}
		m.keyEnd = int32(len(c.dst))
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
		m.end = int32(len(c.dst))
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
	if !c.place(open, inner, c.members[base:]) {
		return false
	}
	c.moves = max(c.moves, outer)
	c.dst = append(c.dst, '}')
	return true
}
