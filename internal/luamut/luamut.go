// Package luamut makes the mutants of a Lua script for mutation testing:
// each mutant is the script with one small change (a comparison flipped, a
// constant changed, a redis.call dropped, a branch dropped) that a test suite
// worth its name notices. The root package's TestLuaMutants runs the store's
// tests against every mutant of lua/*.lua (docs/testing.md).
//
// It reads the subset of Lua the scripts are written in: comments and string
// literals are never mutated.
package luamut

import (
	"fmt"
	"strconv"
	"strings"
)

// Mutant is a script with one change.
type Mutant struct {
	Script string // the script's file name, e.g. "claim.lua"
	Line   int    // the 1-based line of the change
	Col    int    // the 1-based byte column of the change
	Kind   string // the operator: compare, boundary, logical, not, constant, arith, call, branch
	From   string // the text replaced
	To     string // its replacement
	Src    string // the whole mutated script
}

// ID names the mutant: script, line, column, operator and the change. It is
// stable as long as the script is not edited.
func (m Mutant) ID() string {
	return fmt.Sprintf("%s:%d:%d %s %s -> %s", m.Script, m.Line, m.Col, m.Kind, short(m.From), short(m.To))
}

// short shortens a replaced text for an ID: its first line, at most 40 bytes.
func short(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i] + "…"
	}
	if len(s) > 40 {
		s = s[:40] + "…"
	}
	return strconv.Quote(s)
}

// Mutants returns every mutant of the script src named name, in source
// order.
func Mutants(name, src string) []Mutant {
	toks := lex(src)
	var out []Mutant
	add := func(start, end int, kind, to string) {
		line := 1 + strings.Count(src[:start], "\n")
		col := start - strings.LastIndexByte(src[:start], '\n')
		out = append(out, Mutant{
			Script: name, Line: line, Col: col, Kind: kind,
			From: src[start:end], To: to,
			Src: src[:start] + to + src[end:],
		})
	}
	for i, t := range toks {
		switch {
		case t.kind == tokOp && (t.text == "==" || t.text == "~="):
			add(t.start, t.end, "compare", map[string]string{"==": "~=", "~=": "=="}[t.text])
		case t.kind == tokOp && (t.text == "<" || t.text == "<=" || t.text == ">" || t.text == ">="):
			add(t.start, t.end, "boundary", map[string]string{"<": "<=", "<=": "<", ">": ">=", ">=": ">"}[t.text])
		case t.kind == tokName && (t.text == "and" || t.text == "or"):
			add(t.start, t.end, "logical", map[string]string{"and": "or", "or": "and"}[t.text])
		case t.kind == tokName && t.text == "not":
			end := t.end
			for end < len(src) && src[end] == ' ' {
				end++
			}
			add(t.start, end, "not", "")
		case t.kind == tokNumber:
			add(t.start, t.end, "constant", bump(t.text))
		case t.kind == tokOp && (t.text == "+" || t.text == "-") && i > 0 && operand(toks[i-1]):
			add(t.start, t.end, "arith", map[string]string{"+": "-", "-": "+"}[t.text])
		case t.kind == tokName && t.text == "redis" && i+3 < len(toks) &&
			toks[i+1].text == "." && (toks[i+2].text == "call" || toks[i+2].text == "pcall") && toks[i+3].text == "(":
			end := closing(toks, i+3)
			if end < 0 {
				continue
			}
			if statement(src, t.start) {
				add(t.start, toks[end].end, "call", "")
			} else {
				add(t.start, toks[end].end, "call", "false")
			}
		case t.kind == tokName && (t.text == "if" || t.text == "elseif" || t.text == "while"):
			want := "then"
			if t.text == "while" {
				want = "do"
			}
			for j := i + 1; j < len(toks); j++ {
				if toks[j].kind == tokName && toks[j].text == want {
					add(toks[i+1].start, toks[j-1].end, "branch", "false")
					break
				}
			}
		}
	}
	return out
}

// bump returns the number literal n plus one, in its own base: 0 becomes 1,
// 3 becomes 4, 0x070000 becomes 0x070001.
func bump(n string) string {
	if v, err := strconv.ParseInt(n, 0, 64); err == nil {
		if strings.HasPrefix(n, "0x") || strings.HasPrefix(n, "0X") {
			return fmt.Sprintf("0x%0*x", len(n)-2, v+1)
		}
		return strconv.FormatInt(v+1, 10)
	}
	return n + "+1"
}

// operand reports whether a token ends an operand, so that a + or - after
// it is binary.
func operand(t token) bool {
	switch t.kind {
	case tokNumber, tokString:
		return true
	case tokName:
		switch t.text {
		case "and", "or", "not", "return", "if", "elseif", "then", "do", "while", "local", "in", "until":
			return false
		}
		return true
	}
	return t.text == ")" || t.text == "]" || t.text == "}"
}

// closing returns the index of the token closing the bracket at open, or -1.
func closing(toks []token, open int) int {
	depth := 0
	for j := open; j < len(toks); j++ {
		switch toks[j].text {
		case "(", "{", "[":
			depth++
		case ")", "}", "]":
			depth--
			if depth == 0 {
				return j
			}
		}
	}
	return -1
}

// statement reports whether the text before start on its line is blank: the
// call there is a statement of its own, whose result nothing uses.
func statement(src string, start int) bool {
	line := src[strings.LastIndexByte(src[:start], '\n')+1 : start]
	return strings.TrimSpace(line) == ""
}
