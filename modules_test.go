package idem_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestModulesShareVersions keeps the repository's modules (the core, bench/,
// contrib/* and release/) on one version of every dependency they share: a package
// required at two versions is compiled twice by the suite, and a cold run of
// .ci/run pays for it.
func TestModulesShareVersions(t *testing.T) {
	mods, err := filepath.Glob("contrib/*/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	mods = append([]string{"go.mod", "bench/go.mod", "release/go.mod"}, mods...)
	seen := map[string]string{} // module path → "version (go.mod file)"
	for _, mod := range mods {
		for path, version := range requires(t, mod) {
			if strings.HasPrefix(path, "github.com/idemkit/idem") {
				continue // the repository's own modules, replaced by directories
			}
			if prev, ok := seen[path]; ok && !strings.HasPrefix(prev, version+" ") {
				t.Errorf("%s is required at %s in %s and at %s", path, version, mod, prev)
				continue
			}
			seen[path] = version + " (" + mod + ")"
		}
	}
}

// requires returns the module versions a go.mod file requires.
func requires(t *testing.T, file string) map[string]string {
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	block := false
	for line := range strings.Lines(string(b)) {
		line, _, _ = strings.Cut(line, "//")
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "require" && f[1] == "(":
			block = true
		case block && len(f) == 1 && f[0] == ")":
			block = false
		case block && len(f) == 2:
			out[f[0]] = f[1]
		case len(f) == 3 && f[0] == "require":
			out[f[1]] = f[2]
		}
	}
	return out
}
