package main

import (
	"context"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeTree writes files (path → content) under a new temporary folder.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, content := range files {
		path := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// repo is a small copy of the repository's layout: the core with a library
// package, the command in a module of its own (no replace directive: its
// go.work names the core's folder), one contrib module that requires the
// core, and the benchmarks, which are not released.
func repo(contribRequire string) map[string]string {
	return map[string]string{
		"go.mod":             "module github.com/idemkit/idem\n\ngo 1.26.0\n",
		"LICENSE":            "license\n",
		"README.md":          "# idem\n\n```sh\ngo get github.com/idemkit/idem   # the core\n```\n",
		"idem.go":            "// Package idem greets.\npackage idem\n\n// Hello greets.\nfunc Hello() string { return \"hello\" }\n",
		"cmd/idem/go.mod":    "module github.com/idemkit/idem/cmd/idem\n\ngo 1.26.0\n\nrequire github.com/idemkit/idem " + contribRequire + "\n",
		"cmd/idem/go.work":   "go 1.26.0\n\nuse .\n\nreplace github.com/idemkit/idem => ../..\n",
		"cmd/idem/LICENSE":   "license\n",
		"cmd/idem/README.md": "```sh\ngo install github.com/idemkit/idem/cmd/idem@latest\n```\n",
		"cmd/idem/main.go": `package main

import (
	"fmt"
	"os"
	"runtime/debug"

	"github.com/idemkit/idem"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "version" {
		bi, _ := debug.ReadBuildInfo()
		fmt.Println("idem", bi.Main.Version, idem.Hello())
	}
}
`,
		"contrib/x/go.mod":          "module github.com/idemkit/idem/contrib/x\n\ngo 1.26.0\n\nreplace github.com/idemkit/idem => ../..\n\nrequire github.com/idemkit/idem " + contribRequire + "\n",
		"contrib/x/LICENSE":         "license\n",
		"contrib/x/README.md":       "```sh\ngo get github.com/idemkit/idem/contrib/x\n```\n",
		"contrib/x/x.go":            "// Package x greets twice.\npackage x\n\nimport \"github.com/idemkit/idem\"\n\n// Twice greets twice.\nfunc Twice() string { return idem.Hello() + idem.Hello() }\n",
		"contrib/x/internal/y/y.go": "package y\n",
		"bench/go.mod":              "module github.com/idemkit/idem/bench\n\ngo 1.26.0\n",
	}
}

func TestCheckModulesPseudoVersion(t *testing.T) {
	mods, err := loadRepo(writeTree(t, repo("v0.0.0-00010101000000-000000000000")))
	if err != nil {
		t.Fatal(err)
	}
	err = checkModules(mods, "v0.1.0")
	if err == nil || !strings.Contains(err.Error(), "contrib/x/go.mod requires github.com/idemkit/idem at the pseudo-version v0.0.0-00010101000000-000000000000") {
		t.Fatalf("checkModules = %v, want the pseudo-version named", err)
	}
	if v, err := requiredVersion(mods); err != nil || v != "v0.0.0-00010101000000-000000000000" {
		t.Fatalf("requiredVersion = %q, %v", v, err)
	}
}

func TestCheckModulesOtherVersionAndReplace(t *testing.T) {
	files := repo("v0.1.0")
	files["contrib/x/go.mod"] = strings.Replace(files["contrib/x/go.mod"], "=> ../..", "=> ../../bench", 1)
	mods, err := loadRepo(writeTree(t, files))
	if err != nil {
		t.Fatal(err)
	}
	err = checkModules(mods, "v0.2.0")
	for _, want := range []string{"at v0.1.0, not at the release version v0.2.0", "replaces github.com/idemkit/idem with ../../bench, not with its folder ."} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("checkModules = %v, want %q", err, want)
		}
	}
}

func TestCheckModulesLicense(t *testing.T) {
	files := repo("v0.1.0")
	delete(files, "contrib/x/LICENSE")
	root := writeTree(t, files)
	mods, err := loadRepo(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkModules(mods, "v0.1.0"); err == nil || !strings.Contains(err.Error(), "contrib/x has no LICENSE") {
		t.Fatalf("checkModules = %v, want contrib/x's LICENSE missing", err)
	}
	// The zip is checked on its own too: a module whose zip carries no
	// LICENSE is not served.
	err = buildProxy(t.TempDir(), mods, "v0.1.0")
	if err == nil || !strings.Contains(err.Error(), "the zip of github.com/idemkit/idem/contrib/x@v0.1.0 carries no LICENSE") {
		t.Fatalf("buildProxy = %v, want the zip without a LICENSE refused", err)
	}
}

// TestCommandModule: a module of commands is told from the others; a
// replace directive in it is refused, since go install PATH@VERSION would
// refuse it; it has no API to compare.
func TestCommandModule(t *testing.T) {
	files := repo("v0.1.0")
	files["cmd/idem/go.mod"] += "\nreplace github.com/idemkit/idem => ../..\n"
	root := writeTree(t, files)
	mods, err := loadRepo(root)
	if err != nil {
		t.Fatal(err)
	}
	var commands []string
	for _, m := range mods {
		if m.Command {
			commands = append(commands, m.Rel)
		}
	}
	if strings.Join(commands, " ") != "cmd/idem" {
		t.Fatalf("command modules = %v, want cmd/idem alone", commands)
	}
	err = checkModules(mods, "v0.1.0")
	if err == nil || !strings.Contains(err.Error(), "cmd/idem/go.mod has a replace or exclude directive, which go install github.com/idemkit/idem/cmd/idem@v0.1.0 refuses") {
		t.Fatalf("checkModules = %v, want the replace in cmd/idem refused", err)
	}
	os.MkdirAll(filepath.Join(root, "api", "v0.1.0"), 0o755)
	if err := writeBaseline(root, mods, "v0.1.0"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "api", "v0.1.0", "cmd-idem.zip")); !os.IsNotExist(err) {
		t.Errorf("a baseline was written for cmd/idem: %v", err)
	}
}

// TestWorkReplacesAt: prepare moves the versioned replaces of the
// repository's modules in go.work to the release version, and leaves the
// others alone.
func TestWorkReplacesAt(t *testing.T) {
	files := repo("v0.1.0")
	files["go.work"] = "go 1.26.0\n\nuse (\n\t.\n\t./cmd/idem\n\t./contrib/x\n)\n\n" +
		"replace github.com/idemkit/idem/contrib/x v0.1.0 => ./contrib/x\n\nreplace example.com/other v1.0.0 => ./other\n"
	root := writeTree(t, files)
	mods, err := loadRepo(root)
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout, _ = os.Open(os.DevNull)
	err = workReplacesAt(root, mods, "v0.2.0")
	os.Stdout = stdout
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(filepath.Join(root, "go.work"))
	for _, want := range []string{"replace github.com/idemkit/idem/contrib/x v0.2.0 => ./contrib/x", "replace example.com/other v1.0.0 => ./other"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("go.work lacks %q:\n%s", want, data)
		}
	}
}

func TestReleasedAndTags(t *testing.T) {
	mods, err := loadRepo(writeTree(t, repo("v0.1.0")))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range releasedModules(mods) {
		got = append(got, m.tag("v0.1.0"))
	}
	if strings.Join(got, " ") != "v0.1.0 cmd/idem/v0.1.0 contrib/x/v0.1.0" {
		t.Fatalf("tags = %v, want the root's, cmd/idem's and contrib/x's, not bench's", got)
	}
}

// TestCheckInstalls runs the whole release check on the small repository:
// proxy, README lines, a program importing every library package, the
// command's version. It needs no network.
func TestCheckInstalls(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and installs through a module proxy")
	}
	root := writeTree(t, repo("v0.1.0"))
	mods, err := loadRepo(root)
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	out, _ := os.Create(filepath.Join(t.TempDir(), "out"))
	os.Stdout = out
	err = check(context.Background(), root, mods, "", true, false)
	os.Stdout = stdout
	log, _ := os.ReadFile(out.Name())
	if err != nil {
		t.Fatalf("check: %v\n%s", err, log)
	}
	for _, want := range []string{
		"sh -c go get github.com/idemkit/idem   # the core",
		"sh -c go get github.com/idemkit/idem/contrib/x",
		"built a program importing 2 packages of 3 modules",
		"idem v0.1.0 hello",
		"release check: ok",
	} {
		if !strings.Contains(string(log), want) {
			t.Errorf("the check's output lacks %q:\n%s", want, log)
		}
	}
}

func TestCheckRefusesWrongVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and installs through a module proxy")
	}
	files := repo("v0.1.0")
	files["cmd/idem/main.go"] = "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"idem (devel)\") }\n"
	root := writeTree(t, files)
	mods, err := loadRepo(root)
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout, _ = os.Open(os.DevNull)
	err = check(context.Background(), root, mods, "", true, false)
	os.Stdout = stdout
	if err == nil || !strings.Contains(err.Error(), `idem version printed "idem (devel)", not the version v0.1.0`) {
		t.Fatalf("check = %v, want the version refused", err)
	}
}

func TestAPIBreaks(t *testing.T) {
	src := map[string]string{
		"go.mod":     "module example.com/m\n\ngo 1.26.0\n",
		"m.go":       "package m\n\nfunc Foo() {}\n\ntype T struct{ A int }\n\nfunc (T) M() {}\n\nfunc Kept() {}\n",
		"sub/sub.go": "package sub\n\nfunc S() {}\n",
	}
	dir := writeTree(t, src)
	fset := token.NewFileSet()
	old, err := loadAPI(fset, dir)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "m.zip")
	f, _ := os.Create(file)
	if err := writeAPI(f, fset, old); err != nil {
		t.Fatal(err)
	}
	f.Close()
	old, err = readAPI(token.NewFileSet(), file)
	if err != nil {
		t.Fatal(err)
	}
	if text := apiText(old); !strings.Contains(text, "pkg example.com/m, func Foo()") || !strings.Contains(text, "pkg example.com/m, type T struct, A int") || !strings.Contains(text, "pkg example.com/m, method (T) M()") {
		t.Errorf("apiText:\n%s", text)
	}

	os.WriteFile(filepath.Join(dir, "m.go"), []byte("package m\n\nfunc Foo(int) {}\n\ntype T struct{ A int }\n\nfunc Kept() {}\n\nfunc Added() {}\n"), 0o644)
	os.RemoveAll(filepath.Join(dir, "sub"))
	now, err := loadAPI(fset, dir)
	if err != nil {
		t.Fatal(err)
	}
	bs := breaks(old, now)
	var got []string
	for _, b := range bs {
		got = append(got, b.String())
	}
	want := []string{"example.com/m.Foo: changed from func() to func(int)", "example.com/m.T.M: removed", "package example.com/m/sub: removed"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("breaks:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if n := len(unlisted(bs, "## Unreleased\n\n- Added `m.Added`.\n")); n != 3 {
		t.Errorf("%d breaks unlisted by a changelog that names none, want 3", n)
	}
	named := "## v0.2.0 — unreleased\n\n- `m.Foo` takes the count; `(*m.T).M` is gone (use `m.Kept`);\n  package example.com/m/sub is gone.\n"
	if left := unlisted(bs, named); len(left) != 0 {
		t.Errorf("unlisted by a changelog that names every break: %v", left)
	}
}

func TestChangelogSections(t *testing.T) {
	changelog := "# Changelog\n\n## Unreleased\n\n- `idem.Foo` removed.\n\n## v0.1.0 — 2026-12-05\n\nFirst.\n\n## v0.0.9 — unreleased\n"
	if err := releaseSection(changelog, "v0.1.0"); err != nil {
		t.Errorf("releaseSection(v0.1.0) = %v", err)
	}
	if err := releaseSection(changelog, "v0.0.9"); err == nil || !strings.Contains(err.Error(), "has no date") {
		t.Errorf("releaseSection(v0.0.9) = %v, want no date", err)
	}
	if err := releaseSection(changelog, "v0.2.0"); err == nil || !strings.Contains(err.Error(), "no section for v0.2.0") {
		t.Errorf("releaseSection(v0.2.0) = %v, want no section", err)
	}
	since, err := sectionsAfter(changelog, "v0.1.0")
	if err != nil || !strings.Contains(since, "idem.Foo") || strings.Contains(since, "First.") {
		t.Errorf("sectionsAfter = %q, %v", since, err)
	}
}

func TestLists(t *testing.T) {
	for _, tc := range []struct {
		text, pkg, name string
		want            bool
	}{
		{"`idem.Foo` is gone", "idem", "Foo", true},
		{"`Foo` is gone", "idem", "Foo", false}, // a top-level name is written qualified
		{"`idem.FooBar` is gone", "idem", "Foo", false},
		{"`(*idem.Guard).Bar` takes a context", "idem", "(*Guard).Bar", true},
		{"`Guard.Bar` takes a context", "idem", "(*Guard).Bar", true},
		{"`idem.Guard.Barn` takes a context", "idem", "(*Guard).Bar", false},
		{"`idemclient.WithKeyHeader` renamed", "idem", "WithKeyHeader", false},
	} {
		if got := lists(tc.text, tc.pkg, tc.name); got != tc.want {
			t.Errorf("lists(%q, %q, %q) = %v, want %v", tc.text, tc.pkg, tc.name, got, tc.want)
		}
	}
}
