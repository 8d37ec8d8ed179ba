package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/mod/modfile"
)

// A trial installs the released modules the way a user does: in an empty
// module outside the repository, with a module cache of its own, from a
// module proxy that serves them.
type trial struct {
	dir     string    // holds the proxy, the module cache, the user's module and bin
	env     []string  // the go command's environment
	version string    // the release version
	log     io.Writer // each command and, when it fails, its output
}

// newTrial prepares a trial in dir whose go commands read the proxy at
// dir/proxy first and then the machine's download cache; unless offline,
// what neither holds comes from the machine's GOPROXY.
func newTrial(ctx context.Context, dir, version string, offline bool, log io.Writer) (*trial, error) {
	modcache, err := goEnv(ctx, "GOMODCACHE")
	if err != nil {
		return nil, err
	}
	proxy := "file://" + filepath.ToSlash(filepath.Join(dir, "proxy")) + ",file://" + filepath.ToSlash(filepath.Join(modcache, "cache", "download"))
	if !offline {
		machine, err := goEnv(ctx, "GOPROXY")
		if err != nil {
			return nil, err
		}
		if machine != "" && machine != "off" {
			proxy += "," + machine
		}
	}
	t := &trial{dir: dir, version: version, log: log}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "GOPATH", "GOMODCACHE", "GOPROXY", "GOSUMDB", "GONOSUMDB", "GOPRIVATE", "GONOPROXY", "GOFLAGS", "GOWORK", "GOBIN", "GO111MODULE":
			continue
		}
		t.env = append(t.env, kv)
	}
	t.env = append(t.env,
		"GOPATH="+filepath.Join(dir, "gopath"),
		"GOMODCACHE="+filepath.Join(dir, "gopath", "pkg", "mod"),
		"GOPROXY="+proxy,
		"GOSUMDB=off", // the proxy's modules are not in the checksum database yet
		goflags("-mod=mod", "-trimpath"),
		"GOWORK=off",
		"GOBIN="+filepath.Join(dir, "bin"),
	)
	for _, d := range []string{"proxy", "user", "bin"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// run runs a command in the folder dir of the trial and returns its output.
func (t *trial) run(ctx context.Context, dir string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = filepath.Join(t.dir, dir)
	cmd.Env = t.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	fmt.Fprintf(t.log, "  $ %s\n", strings.Join(append([]string{name}, args...), " "))
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, indent(out.String()))
	}
	return out.String(), nil
}

// install runs every README's go get line in an empty module, requires
// every released module at the version, builds a program that imports every
// library package of every released module, and installs the command that
// prints the version.
func (t *trial) install(ctx context.Context, mods []*repoModule, cmdPath string) error {
	if _, err := t.run(ctx, "user", "go", "mod", "init", "example.com/user"); err != nil {
		return err
	}
	rel := releasedModules(mods)
	for _, m := range rel {
		lines, err := readmeGoGets(filepath.Join(m.Dir, "README.md"))
		if err != nil {
			return err
		}
		for _, line := range lines {
			if _, err := t.run(ctx, "user", "sh", "-c", line); err != nil {
				return fmt.Errorf("%s/README.md: %w", m.Rel, err)
			}
		}
	}
	var imports []string
	for _, m := range rel {
		if _, err := t.run(ctx, "user", "go", "get", m.Path+"@"+t.version); err != nil {
			return err
		}
		pkgs, err := libraryPackages(ctx, m)
		if err != nil {
			return err
		}
		imports = append(imports, pkgs...)
	}
	if err := t.requireAll(rel); err != nil {
		return err
	}
	sort.Strings(imports)
	var src strings.Builder
	src.WriteString("// Command user imports every library package of every released module.\npackage main\n\nimport (\n")
	for _, p := range imports {
		fmt.Fprintf(&src, "\t_ %q\n", p)
	}
	src.WriteString(")\n\nfunc main() {}\n")
	if err := os.WriteFile(filepath.Join(t.dir, "user", "main.go"), []byte(src.String()), 0o644); err != nil {
		return err
	}
	if _, err := t.run(ctx, "user", "go", "build", "-o", os.DevNull, "."); err != nil {
		return err
	}
	fmt.Fprintf(t.log, "  built a program importing %d packages of %d modules\n", len(imports), len(rel))
	if cmdPath == "" {
		return nil
	}
	if _, err := t.run(ctx, ".", "go", "install", cmdPath+"@"+t.version); err != nil {
		return err
	}
	bin := filepath.Join(t.dir, "bin", filepath.Base(cmdPath))
	out, err := t.run(ctx, ".", bin, "version")
	if err != nil {
		return err
	}
	if !strings.Contains(out, t.version) {
		return fmt.Errorf("%s version printed %q, not the version %s", filepath.Base(cmdPath), strings.TrimSpace(out), t.version)
	}
	fmt.Fprintf(t.log, "  %s", out)
	return nil
}

// requireAll reports an error unless the user's go.mod requires every
// released module at the version.
func (t *trial) requireAll(rel []*repoModule) error {
	data, err := os.ReadFile(filepath.Join(t.dir, "user", "go.mod"))
	if err != nil {
		return err
	}
	f, err := modfile.ParseLax("go.mod", data, nil)
	if err != nil {
		return err
	}
	got := map[string]string{}
	for _, r := range f.Require {
		got[r.Mod.Path] = r.Mod.Version
	}
	for _, m := range rel {
		if got[m.Path] != t.version {
			return fmt.Errorf("the user's go.mod requires %s at %q, not %s", m.Path, got[m.Path], t.version)
		}
	}
	return nil
}

// readmeGoGets returns the go get lines of a README's code blocks, as written.
func readmeGoGets(file string) ([]string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines []string
	fenced := false
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if fenced && strings.HasPrefix(line, "go get ") {
			lines = append(lines, line)
		}
	}
	return lines, s.Err()
}

// libraryPackages returns the import paths of m's packages that another
// module can import: not main, not internal.
func libraryPackages(ctx context.Context, m *repoModule) ([]string, error) {
	if m.Command {
		return nil, nil
	}
	cmd := exec.CommandContext(ctx, "go", "list", "-e", "-f", "{{if and .GoFiles (ne .Name \"main\")}}{{.ImportPath}}{{end}}", "./...")
	cmd.Dir = m.Dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: go list: %v", m.Rel, err)
	}
	var pkgs []string
	for _, p := range strings.Fields(string(out)) {
		if p == "internal" || strings.Contains(p, "/internal/") || strings.HasSuffix(p, "/internal") {
			continue
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, nil
}

// goEnv returns one variable of go env.
func goEnv(ctx context.Context, name string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", name).Output()
	if err != nil {
		return "", fmt.Errorf("go env %s: %v", name, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// indent prefixes every line of s for a report.
func indent(s string) string {
	var b strings.Builder
	for line := range strings.Lines(strings.TrimRight(s, "\n")) {
		b.WriteString("    | " + line)
	}
	return b.String() + "\n"
}
