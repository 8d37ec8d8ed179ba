package main

import "testing"

func TestFirstFailure(t *testing.T) {
	for out, want := range map[string]string{
		"=== RUN   TestA\n    --- FAIL: TestA/sub (0.00s)\n--- FAIL: TestA (0.01s)\nFAIL\n": " by TestA/sub",
		"--- FAIL: TestB (0.00s)\n--- FAIL: TestC (0.00s)\n":                                " by TestB",
		"panic: boom\nFAIL\tpkg\t0.01s\n":                                                   "",
	} {
		if got := firstFailure(out); got != want {
			t.Errorf("firstFailure(%q) = %q, want %q", out, got, want)
		}
	}
}
