package luamut

import "strings"

// tokKind is the kind of a Lua token.
type tokKind int

const (
	tokName   tokKind = iota // an identifier or a keyword
	tokNumber                // a number literal
	tokString                // a string literal, quotes included
	tokOp                    // an operator or a bracket
)

// token is one Lua token: its kind, its text and its byte offsets.
type token struct {
	kind       tokKind
	text       string
	start, end int
}

// ops are Lua's operators, the longest first.
var ops = []string{"...", "..", "==", "~=", "<=", ">=", "<", ">", "=", "+", "-", "*", "/", "%", "^", "#",
	"(", ")", "{", "}", "[", "]", ";", ":", ",", "."}

// lex splits src into tokens, leaving out spaces and comments. Text it does
// not know (which the scripts never hold) becomes one-byte operators.
func lex(src string) []token {
	var toks []token
	i := 0
	for i < len(src) {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case strings.HasPrefix(src[i:], "--"):
			i = comment(src, i)
		case c == '\'' || c == '"':
			j := quoted(src, i)
			toks = append(toks, token{tokString, src[i:j], i, j})
			i = j
		case strings.HasPrefix(src[i:], "[[") || strings.HasPrefix(src[i:], "[="):
			if j := long(src, i); j > i {
				toks = append(toks, token{tokString, src[i:j], i, j})
				i = j
				break
			}
			toks = append(toks, token{tokOp, "[", i, i + 1})
			i++
		case isDigit(c) || (c == '.' && i+1 < len(src) && isDigit(src[i+1])):
			j := i + 1
			for j < len(src) && (isDigit(src[j]) || isLetter(src[j]) || src[j] == '.') {
				j++
			}
			toks = append(toks, token{tokNumber, src[i:j], i, j})
			i = j
		case isLetter(c):
			j := i + 1
			for j < len(src) && (isLetter(src[j]) || isDigit(src[j])) {
				j++
			}
			toks = append(toks, token{tokName, src[i:j], i, j})
			i = j
		default:
			op := src[i : i+1]
			for _, o := range ops {
				if strings.HasPrefix(src[i:], o) {
					op = o
					break
				}
			}
			toks = append(toks, token{tokOp, op, i, i + len(op)})
			i += len(op)
		}
	}
	return toks
}

// comment returns the offset after the comment at i: to the end of its line,
// or of its long bracket ("--[[ ... ]]").
func comment(src string, i int) int {
	if j := long(src, i+2); j > i+2 {
		return j
	}
	if j := strings.IndexByte(src[i:], '\n'); j >= 0 {
		return i + j
	}
	return len(src)
}

// quoted returns the offset after the quoted string starting at i.
func quoted(src string, i int) int {
	q := src[i]
	j := i + 1
	for j < len(src) && src[j] != q && src[j] != '\n' {
		if src[j] == '\\' {
			j++
		}
		j++
	}
	return min(j+1, len(src))
}

// long returns the offset after the long bracket ([[...]], [==[...]==])
// starting at i, or i when there is none.
func long(src string, i int) int {
	if i >= len(src) || src[i] != '[' {
		return i
	}
	j := i + 1
	for j < len(src) && src[j] == '=' {
		j++
	}
	if j >= len(src) || src[j] != '[' {
		return i
	}
	end := "]" + strings.Repeat("=", j-i-1) + "]"
	k := strings.Index(src[j+1:], end)
	if k < 0 {
		return len(src)
	}
	return j + 1 + k + len(end)
}

func isDigit(c byte) bool  { return c >= '0' && c <= '9' }
func isLetter(c byte) bool { return c == '_' || (c|0x20 >= 'a' && c|0x20 <= 'z') }
