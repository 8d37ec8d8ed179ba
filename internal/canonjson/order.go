package canonjson

import (
	"bytes"
	"cmp"
	"slices"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// This file puts object members in order, and refuses names that a
// decoder may take for one.

// place puts the members ms of the object that opens at dst[open] in
// order, and reports whether their names are distinct. objs[inner:] are
// the objects recorded inside it.
func (c *Canonicalizer) place(open, inner int, ms []member) bool {
	inOrder, ok := c.arrange(ms)
	switch {
	case !ok:
		c.dupKeys = true
		return false
	case inOrder:
	case inner == len(c.objs) && c.moves < maxMoves:
		// Rewrite the members now: no object inside waits for rewrite
		// (it would move), and no byte inside was rewritten maxMoves
		// times already, so a byte moves a bounded number of times
		// however deep the objects nest. Most objects end here and
		// need no second pass.
		c.tmp = append(c.tmp[:0], c.dst[open+1:]...)
		c.dst = c.dst[:open+1]
		for k, m := range ms {
			if k > 0 {
				c.dst = append(c.dst, ',')
			}
			c.dst = append(c.dst, c.tmp[int(m.start)-open-1:int(m.end)-open-1]...)
		}
		c.moves++
	default:
		// Rewriting now would move the objects inside again: record the
		// order, for rewrite.
		c.objs = append(c.objs, reorder{open: int32(open), close: int32(len(c.dst)), m0: int32(len(c.sorted)),
			m1: int32(len(c.sorted) + len(ms)), inner: int32(inner)})
		c.sorted = append(c.sorted, ms...)
	}
	return true
}

// arrange sorts an object's members by name and reports whether they were
// in order already, and whether their names are distinct, also for
// encoding/json's case-insensitive matching.
func (c *Canonicalizer) arrange(ms []member) (inOrder, ok bool) {
	if len(ms) < 2 {
		return true, true
	}
	inOrder = true
	for k := 1; k < len(ms) && inOrder; k++ {
		switch bytes.Compare(c.key(ms[k-1]), c.key(ms[k])) {
		case 0:
			return true, false
		case 1:
			inOrder = false
		}
	}
	if !inOrder {
		slices.SortFunc(ms, c.compare)
		for k := 1; k < len(ms); k++ {
			if bytes.Equal(c.key(ms[k-1]), c.key(ms[k])) {
				return false, false
			}
		}
	}
	return inOrder, !c.foldDuplicates(ms)
}

// key returns m's name without its quotes.
func (c *Canonicalizer) key(m member) []byte { return c.dst[m.start+1 : m.keyEnd-1] }

// compare orders members by name.
func (c *Canonicalizer) compare(a, b member) int { return bytes.Compare(c.key(a), c.key(b)) }

// foldDuplicates reports whether two of the distinct names in ms decode to
// names that encoding/json takes for one when it decodes into a struct:
// equal once invalid UTF-8 and lone surrogates become U+FFFD and case is
// folded. A name of lower-case ASCII letters, digits and punctuation is its
// own folded form and differs from every other such name: only the other
// names need comparing.
func (c *Canonicalizer) foldDuplicates(ms []member) bool {
	c.folds = c.folds[:0]
	ascii := true // no name has escapes or non-ASCII bytes
	for _, m := range ms {
		if class := nameClass(c.key(m)); class != 0 {
			ascii = ascii && class == foldUpper
			c.folds = append(c.folds, m)
		}
	}
	if len(c.folds) == 0 {
		return false
	}
	if len(c.folds)*len(ms) <= 256 {
		for _, f := range c.folds {
			kf := c.key(f)
			for _, m := range ms {
				km := c.key(m)
				if ascii && (len(kf) != len(km) || !bytes.EqualFold(kf, km)) || m == f {
					continue
				}
				if ascii || c.foldCompare(f, m) == 0 {
					return true
				}
			}
		}
		return false
	}
	c.folds = append(c.folds[:0], ms...)
	slices.SortFunc(c.folds, c.foldCompare)
	for k := 1; k < len(c.folds); k++ {
		if c.foldCompare(c.folds[k-1], c.folds[k]) == 0 {
			return true
		}
	}
	return false
}

// foldClass sorts the bytes of names: those that are their own folded form
// (0), upper-case ASCII letters, and the others (escapes, non-ASCII).
var foldClass = func() (t [256]uint8) {
	for b := range t {
		switch {
		case 'A' <= b && b <= 'Z':
			t[b] = foldUpper
		case b == '\\' || b >= utf8.RuneSelf:
			t[b] = foldOther
		}
	}
	return t
}()

const (
	foldUpper = 1
	foldOther = 2
)

// nameClass returns the highest foldClass of the bytes of a name.
func nameClass(k []byte) uint8 {
	var class uint8
	for _, b := range k {
		class = max(class, foldClass[b])
	}
	return class
}

// foldCompare orders members by folded name.
func (c *Canonicalizer) foldCompare(a, b member) int {
	x, y := c.key(a), c.key(b)
	for len(x) > 0 && len(y) > 0 {
		rx, nx := foldedRune(x)
		ry, ny := foldedRune(y)
		if rx != ry {
			return cmp.Compare(rx, ry)
		}
		x, y = x[nx:], y[ny:]
	}
	return cmp.Compare(len(x), len(y))
}

// foldedRune decodes the first character of a name in canonical form as
// encoding/json does (invalid UTF-8 and lone surrogates become U+FFFD) and
// folds it as encoding/json does to match names with struct fields (the
// smallest rune of its case-folding orbit, upper case for ASCII).
func foldedRune(s []byte) (rune, int) {
	b := s[0]
	if b == '\\' { // in canonical form, always an escape: \ and a byte, at least
		switch e := s[1]; e {
		case 'b':
			return '\b', 2
		case 'f':
			return '\f', 2
		case 'n':
			return '\n', 2
		case 'r':
			return '\r', 2
		case 't':
			return '\t', 2
		case 'u': // a control character, or a lone surrogate
			if r, ok := parseHex4(s[2:]); ok {
				if utf16.IsSurrogate(r) {
					return utf8.RuneError, 6
				}
				return r, 6
			}
		default: // " and \
			return rune(e), 2
		}
	}
	if b < utf8.RuneSelf {
		if 'a' <= b && b <= 'z' {
			b -= 'a' - 'A'
		}
		return rune(b), 1
	}
	r, n := utf8.DecodeRune(s)
	for {
		f := unicode.SimpleFold(r)
		if f <= r {
			return f, n
		}
		r = f
	}
}

// rewrite writes the output again with the members of the objects in
// c.objs in order. Every byte moves once, however deep the objects nest.
func (c *Canonicalizer) rewrite() {
	if cap(c.tmp) < len(c.dst) {
		c.tmp = make([]byte, 0, len(c.dst))
	}
	out := c.emit(c.tmp[:0], 0, len(c.dst), 0, len(c.objs))
	c.tmp, c.dst = c.dst, out
}

// emit appends dst[lo:hi] to out, writing the objects of c.objs[a:b], which
// are those that closed in dst[lo:hi], with their members in order.
func (c *Canonicalizer) emit(out []byte, lo, hi, a, b int) []byte {
	// The outermost objects of objs[a:b], last first: each one follows
	// the objects that closed inside it.
	base := len(c.tops)
	for k := b - 1; k >= a; k = int(c.objs[k].inner) - 1 {
		c.tops = append(c.tops, k)
	}
	for t := len(c.tops) - 1; t >= base; t-- {
		k := c.tops[t]
		o := c.objs[k]
		out = append(out, c.dst[lo:o.open+1]...)
		for n, m := range c.sorted[o.m0:o.m1] {
			if n > 0 {
				out = append(out, ',')
			}
			from, to := c.closedFrom(int(o.inner), k, int(m.start)), c.closedFrom(int(o.inner), k, int(m.end))
			out = c.emit(out, int(m.start), int(m.end), from, to)
		}
		out = append(out, '}')
		lo = int(o.close) + 1
	}
	c.tops = c.tops[:base]
	return append(out, c.dst[lo:hi]...)
}

// closedFrom returns the index of the first object of c.objs[a:b] that
// closed at pos or later.
func (c *Canonicalizer) closedFrom(a, b, pos int) int {
	for a < b {
		h := int(uint(a+b) >> 1)
		if int(c.objs[h].close) < pos {
			a = h + 1
		} else {
			b = h
		}
	}
	return a
}
