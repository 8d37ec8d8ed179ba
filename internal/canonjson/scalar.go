package canonjson

// The scalars of a JSON text: strings, rewritten with only the escapes JSON
// requires, and numbers, copied as written.

import (
	"bytes"
	"encoding/hex"
	"unicode/utf16"
	"unicode/utf8"
)

// str copies a string in canonical form: the escapes decoded, then only ",
// \ and control characters escaped.
func (c *Canonicalizer) str() bool {
	c.i++ // opening quote
	c.dst = append(c.dst, '"')
	for {
		// Copy the run of plain bytes.
		j := c.i
		for j < len(c.src) && c.src[j] != '"' && c.src[j] != '\\' && c.src[j] >= 0x20 {
			j++
		}
		c.dst = append(c.dst, c.src[c.i:j]...)
		c.i = j
		if j == len(c.src) {
			return false
		}
		if c.src[j] == '"' {
			c.i++
			c.dst = append(c.dst, '"')
			return true
		}
		if c.src[j] != '\\' { // a control character
			return false
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
			r, ok := parseHex4(c.src[c.i:])
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
				c.dst = append(c.dst, '\\', 'u', hexDigit(r>>12), hexDigit(r>>8), hexDigit(r>>4), hexDigit(r))
				continue
			}
			c.appendRune(r)
		default:
			return false
		}
	}
}

// lowSurrogate returns the \uXXXX escape at c.i, if there is one.
func (c *Canonicalizer) lowSurrogate() (rune, bool) {
	if !bytes.HasPrefix(c.src[c.i:], []byte(`\u`)) {
		return 0, false
	}
	return parseHex4(c.src[c.i+2:])
}

// appendRune writes a decoded \u escape in canonical form.
func (c *Canonicalizer) appendRune(r rune) {
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
			c.dst = append(c.dst, '\\', 'u', '0', '0', hexDigit(r>>4), hexDigit(r))
			return
		}
		c.dst = utf8.AppendRune(c.dst, r)
	}
}

// parseHex4 decodes the four hex digits that s starts with.
func parseHex4(s []byte) (rune, bool) {
	var b [2]byte
	if len(s) < 4 {
		return 0, false
	}
	if _, err := hex.Decode(b[:], s[:4]); err != nil {
		return 0, false
	}
	return rune(b[0])<<8 | rune(b[1]), true
}

func hexDigit(r rune) byte { return "0123456789abcdef"[r&0xf] }

// number copies a number as written, after checking its grammar:
// -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
func (c *Canonicalizer) number() bool {
	s, i := c.src, c.i
	digits := func() bool {
		j := i
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
		return i > j
	}
	if s[i] == '-' { // value saw a byte at i
		i++
	}
	if i < len(s) && s[i] == '0' {
		i++
	} else if !digits() {
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
