package main

import (
	"bytes"
	"fmt"
)

// mutations are gremlins v0.6.0's, by type: the operator at the mutant's
// position and what it becomes.
var mutations = map[string]map[string]string{
	"ARITHMETIC_BASE":       {"+": "-", "-": "+", "*": "/", "/": "*", "%": "*"},
	"CONDITIONALS_BOUNDARY": {"<": "<=", "<=": "<", ">": ">=", ">=": ">"},
	"CONDITIONALS_NEGATION": {"==": "!=", "!=": "==", "<": ">=", "<=": ">", ">": "<=", ">=": "<"},
	"INCREMENT_DECREMENT":   {"++": "--", "--": "++"},
	"INVERT_NEGATIVES":      {"-": "+"},
}

// apply returns src with the operator at line:col (1-based, in bytes)
// replaced as the mutation type does.
func apply(src []byte, typ string, line, col int) ([]byte, error) {
	table, ok := mutations[typ]
	if !ok {
		return nil, fmt.Errorf("unknown mutation type %s", typ)
	}
	off := 0
	for range line - 1 {
		i := bytes.IndexByte(src[off:], '\n')
		if i < 0 {
			return nil, fmt.Errorf("no line %d", line)
		}
		off += i + 1
	}
	off += col - 1
	if col < 1 || off >= len(src) {
		return nil, fmt.Errorf("no column %d on line %d", col, line)
	}
	rest := string(src[off:min(off+2, len(src))])
	for _, op := range []string{rest, rest[:1]} { // "<=" before "<"
		if to, ok := table[op]; ok {
			return bytes.Join([][]byte{src[:off], []byte(to), src[off+len(op):]}, nil), nil
		}
	}
	return nil, fmt.Errorf("%s: no operator of the type at %d:%d (%q)", typ, line, col, rest)
}
