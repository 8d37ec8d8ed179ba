// Command release checks and prepares a release of idem's modules. Every
// module of the repository is released at one version from one commit, but
// bench/ and release/; the root's tag is vX.Y.Z, a module in folder DIR
// gets DIR/vX.Y.Z (RELEASING.md).
//
//	go -C release run . check [-version V] [-offline] [-keep]
//	go -C release run . api [-write V]
//	go -C release run . prepare V
//	go -C release run . tags V
//
// check is the release check CI runs: the modules require each other at one
// version V (never a pseudo-version) and carry their LICENSE; it builds a
// module proxy from the checkout at V, then, in an empty module outside the
// repository with a module cache of its own, runs every README's go get
// line as written, builds a program importing every library package of
// every released module, installs github.com/idemkit/idem/cmd/idem@V and
// checks that idem version prints V. Third-party modules come from the
// machine's download cache, then (unless -offline) from its GOPROXY.
//
// api compares every released module's exported API with the baseline of
// the last release in api/VERSION/ and fails on an incompatible change that
// CHANGELOG.md does not name above that release's section; a module of
// commands only (cmd/idem) has none. With -write V it writes the baseline
// of V instead.
//
// prepare V makes the checkout ready to tag V: it requires every module of
// the repository at V, tidies every module (a module of commands, whose
// go.mod has no replace directive, with the replaces of its siblings while
// tidy runs), checks that CHANGELOG.md has a
// dated section for V, compares the API with the last baseline and writes
// V's, runs the release check, and prints the tags to push. It pushes
// nothing and commits nothing. tags V prints the tags alone.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"go/token"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/semver"
)

// cmdPath is the command whose version the check installs and asks.
const cmdPath = "github.com/idemkit/idem/cmd/idem"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if len(os.Args) < 2 {
		usage()
	}
	root, err := repoRoot()
	if err == nil {
		err = run(ctx, root, os.Args[1], os.Args[2:])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "release: %v\n", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: release check [-version V] [-offline] [-keep] | api [-write V] | prepare V | tags V")
	os.Exit(2)
}

// run runs one subcommand on the repository at root.
func run(ctx context.Context, root, sub string, args []string) error {
	fs := flag.NewFlagSet(sub, flag.ExitOnError)
	version := fs.String("version", "", "the release version (default: the version the modules require each other at)")
	offline := fs.Bool("offline", false, "take third-party modules from the machine's download cache only")
	keep := fs.Bool("keep", false, "keep the trial's folder")
	write := fs.String("write", "", "write the API baseline of this version")
	fs.Parse(args)
	mods, err := loadRepo(root)
	if err != nil {
		return err
	}
	switch {
	case sub == "check" && fs.NArg() == 0:
		return check(ctx, root, mods, *version, *offline, *keep)
	case sub == "api" && fs.NArg() == 0 && *write == "":
		return compareAPI(root, mods)
	case sub == "api" && fs.NArg() == 0:
		return writeBaseline(root, mods, *write)
	case sub == "prepare" && fs.NArg() == 1:
		return prepare(ctx, root, mods, fs.Arg(0))
	case sub == "tags" && fs.NArg() == 1:
		return printTags(mods, fs.Arg(0))
	}
	usage()
	return nil
}

// check runs the release check at version, or at the version the modules
// require each other at.
func check(ctx context.Context, root string, mods []*repoModule, version string, offline, keep bool) error {
	if version == "" {
		v, err := requiredVersion(mods)
		if err != nil {
			return err
		}
		version = v
	}
	fmt.Printf("release check of %d modules at %s\n", len(releasedModules(mods)), version)
	if err := checkModules(mods, version); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "idem-release-")
	if err != nil {
		return err
	}
	if keep {
		fmt.Printf("  trial folder: %s\n", dir)
	} else {
		defer removeAll(dir)
	}
	t, err := newTrial(ctx, dir, version, offline, os.Stdout)
	if err != nil {
		return err
	}
	if err := buildProxy(filepath.Join(dir, "proxy"), mods, version); err != nil {
		return err
	}
	for _, m := range releasedModules(mods) {
		fmt.Printf("  proxy: %s@%s\n", m.Path, version)
	}
	if err := t.install(ctx, mods, cmdPath); err != nil {
		return err
	}
	fmt.Println("release check: ok")
	return nil
}

// removeAll removes a trial's folder, whose module cache is read-only.
func removeAll(dir string) {
	exec.Command("chmod", "-R", "u+w", dir).Run()
	os.RemoveAll(dir)
}

// compareAPI fails on an incompatible change since the last baseline that
// the changelog does not name.
func compareAPI(root string, mods []*repoModule) error {
	dir, version, err := baselineDir(root)
	if err != nil {
		return err
	}
	if dir == "" {
		return errors.New("no API baseline in api/: write one with api -write VERSION")
	}
	changelog, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		return err
	}
	since, err := sectionsAfter(string(changelog), version)
	if err != nil {
		return err
	}
	fset := token.NewFileSet()
	var all, missing []apiBreak
	for _, m := range releasedModules(mods) {
		if m.Command {
			continue // commands only: no API
		}
		old, err := readAPI(fset, filepath.Join(dir, baselineFile(m)+".zip"))
		if errors.Is(err, os.ErrNotExist) {
			fmt.Printf("api: %s is new since %s\n", m.Path, version)
			continue
		}
		if err != nil {
			return err
		}
		now, err := loadAPI(fset, m.Dir)
		if err != nil {
			return fmt.Errorf("%s: %w", m.Rel, err)
		}
		bs := breaks(old, now)
		all = append(all, bs...)
		missing = append(missing, unlisted(bs, since)...)
	}
	for _, b := range all {
		fmt.Printf("api: incompatible since %s: %s\n", version, b)
	}
	if len(missing) > 0 {
		var lines []string
		for _, b := range missing {
			lines = append(lines, "  "+b.String())
		}
		return fmt.Errorf("incompatible API changes since %s that CHANGELOG.md does not name above its %s section (name each, e.g. `%s.%s`, with how to migrate):\n%s",
			version, version, missing[0].Pkg.Name(), missing[0].Name, strings.Join(lines, "\n"))
	}
	fmt.Printf("api: compatible with %s (%d modules)\n", version, len(releasedModules(mods)))
	return nil
}

// writeBaseline writes the API of every released module as the baseline of
// version, in place of older baselines.
func writeBaseline(root string, mods []*repoModule, version string) error {
	if !semver.IsValid(version) {
		return fmt.Errorf("%q is not a semantic version", version)
	}
	old, _, err := baselineDir(root)
	if err != nil {
		return err
	}
	dir := filepath.Join(root, "api", version)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	fset := token.NewFileSet()
	for _, m := range releasedModules(mods) {
		if m.Command {
			continue // commands only: no API
		}
		a, err := loadAPI(fset, m.Dir)
		if err != nil {
			return fmt.Errorf("%s: %w", m.Rel, err)
		}
		f, err := os.Create(filepath.Join(dir, baselineFile(m)+".zip"))
		if err != nil {
			return err
		}
		err = writeAPI(f, fset, a)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, baselineFile(m)+".txt"), []byte(apiText(a)), 0o644); err != nil {
			return err
		}
	}
	if old != "" && old != dir {
		if err := os.RemoveAll(old); err != nil {
			return err
		}
	}
	fmt.Printf("api: wrote the baseline of %s in %s\n", version, dir)
	return nil
}

// prepare makes the checkout ready to tag version.
func prepare(ctx context.Context, root string, mods []*repoModule, version string) error {
	if !semver.IsValid(version) || semver.Canonical(version) != version {
		return fmt.Errorf("%q is not a canonical semantic version (v1.2.3)", version)
	}
	changelog, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		return err
	}
	if err := releaseSection(string(changelog), version); err != nil {
		return err
	}
	if err := requireAt(mods, version); err != nil {
		return err
	}
	if err := workReplacesAt(root, mods, version); err != nil {
		return err
	}
	for _, m := range mods {
		if m.Command {
			if err := tidyCommand(ctx, m, mods); err != nil {
				return err
			}
			continue
		}
		if err := goIn(ctx, m.Dir, "mod", "tidy"); err != nil {
			return fmt.Errorf("%s: %w", m.Rel, err)
		}
	}
	if mods, err = loadRepo(root); err != nil {
		return err
	}
	if _, v, err := baselineDir(root); err != nil {
		return err
	} else if v != "" && v != version {
		if err := compareAPI(root, mods); err != nil {
			return err
		}
	}
	if err := writeBaseline(root, mods, version); err != nil {
		return err
	}
	if err := check(ctx, root, mods, version, false, false); err != nil {
		return err
	}
	fmt.Printf("\nCommit the changes (git add -A && git commit -m %q), then tag that commit:\n", "Release "+version)
	return printTags(mods, version)
}

// requireAt rewrites every requirement of a module of the repository to
// version.
func requireAt(mods []*repoModule, version string) error {
	by := siblings(mods)
	for _, m := range mods {
		changed := false
		for _, r := range m.File.Require {
			if by[r.Mod.Path] != nil && r.Mod.Version != version {
				if err := m.File.AddRequire(r.Mod.Path, version); err != nil {
					return err
				}
				changed = true
			}
		}
		if !changed {
			continue
		}
		m.File.Cleanup()
		data, err := m.File.Format()
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(m.Dir, "go.mod"), data, 0o644); err != nil {
			return err
		}
		fmt.Printf("%s/go.mod: requires the repository's modules at %s\n", m.Rel, version)
	}
	return nil
}

// printTags prints the git commands that tag and push version.
func printTags(mods []*repoModule, version string) error {
	if !semver.IsValid(version) {
		return fmt.Errorf("%q is not a semantic version", version)
	}
	var tags []string
	for _, m := range releasedModules(mods) {
		tags = append(tags, m.tag(version))
		fmt.Printf("git tag -a %s -m %q\n", m.tag(version), m.Path+" "+version)
	}
	fmt.Printf("git push origin %s\n", strings.Join(tags, " "))
	return nil
}

// goIn runs a go command in dir with the repository's modules on their own.
func goIn(ctx context.Context, dir string, args ...string) error {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, indent(string(out)))
	}
	return nil
}

// repoRoot returns the root of the repository: the folder above this
// module's, where the core's go.mod is.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if data, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && modfile.ModulePath(data) == "github.com/idemkit/idem" {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("%s is not inside the idem repository", dir)
		}
	}
}

// goflags returns the GOFLAGS setting of the go commands the tool runs:
// the environment's GOFLAGS with flags added. A GOFLAGS of "-race
// -trimpath", as CI sets it, has them build packages as the tests built
// them, so that they come from the build cache.
func goflags(flags ...string) string {
	all := strings.Fields(os.Getenv("GOFLAGS"))
	for _, f := range flags {
		if !slices.Contains(all, f) {
			all = append(all, f)
		}
	}
	return "GOFLAGS=" + strings.Join(all, " ")
}
