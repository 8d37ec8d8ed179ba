package main

import (
	"strings"
	"testing"
)

func TestApply(t *testing.T) {
	src := "package p\n\nconst a = 1 << 20\n\nfunc f(x, y int) bool {\n\tswitch {\n\tcase x <= y:\n\t\treturn x != -y\n\t}\n\tx++\n\treturn x*2 > y\n}\n"
	tests := []struct {
		typ       string
		line, col int
		want      string // the mutated line
	}{
		{"CONDITIONALS_BOUNDARY", 7, 9, "\tcase x < y:"},
		{"CONDITIONALS_NEGATION", 7, 9, "\tcase x > y:"},
		{"CONDITIONALS_NEGATION", 8, 12, "\t\treturn x == -y"},
		{"INVERT_NEGATIVES", 8, 15, "\t\treturn x != +y"},
		{"INCREMENT_DECREMENT", 10, 3, "\tx--"},
		{"ARITHMETIC_BASE", 11, 10, "\treturn x/2 > y"},
		{"CONDITIONALS_NEGATION", 11, 13, "\treturn x*2 <= y"},
	}
	for _, tt := range tests {
		out, err := apply([]byte(src), tt.typ, tt.line, tt.col)
		if err != nil {
			t.Errorf("%s at %d:%d: %v", tt.typ, tt.line, tt.col, err)
			continue
		}
		if got := lineOf(string(out), tt.line); got != tt.want {
			t.Errorf("%s at %d:%d: got %q, want %q", tt.typ, tt.line, tt.col, got, tt.want)
		}
	}
	for _, bad := range []struct {
		typ       string
		line, col int
	}{
		{"ARITHMETIC_BASE", 7, 9}, // no arithmetic operator there
		{"NO_SUCH_TYPE", 7, 9},
		{"ARITHMETIC_BASE", 99, 1},
		{"ARITHMETIC_BASE", 7, 99},
	} {
		if _, err := apply([]byte(src), bad.typ, bad.line, bad.col); err == nil {
			t.Errorf("%s at %d:%d: no error", bad.typ, bad.line, bad.col)
		}
	}
}

// lineOf returns line n (1-based) of s.
func lineOf(s string, n int) string { return strings.Split(s, "\n")[n-1] }
