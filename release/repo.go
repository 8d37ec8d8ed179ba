package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
)

// unreleased names the folders whose modules are never tagged: the
// benchmarks and this tool.
var unreleased = []string{"bench", "release"}

// A repoModule is one module of the repository.
type repoModule struct {
	Path string        // module path
	Dir  string        // absolute folder
	Rel  string        // folder relative to the repository root, "." for the root
	File *modfile.File // its go.mod
	// Command: the module holds commands only (command.go).
	Command bool
}

// released reports whether m is tagged and published.
func (m *repoModule) released() bool { return !slices.Contains(unreleased, m.Rel) }

// tag returns the git tag of m at version v: v for the root module, DIR/v for
// a module in folder DIR.
func (m *repoModule) tag(v string) string {
	if m.Rel == "." {
		return v
	}
	return m.Rel + "/" + v
}

// loadRepo returns the modules under root, the root's first, then by folder.
func loadRepo(root string) ([]*repoModule, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	var mods []*repoModule
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && path != root && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
			return filepath.SkipDir
		}
		if d.IsDir() || name != "go.mod" {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f, err := modfile.Parse(path, data, nil)
		if err != nil {
			return err
		}
		if f.Module == nil {
			return fmt.Errorf("%s: no module line", path)
		}
		dir := filepath.Dir(path)
		rel, _ := filepath.Rel(root, dir)
		command, err := commandsOnly(dir)
		if err != nil {
			return err
		}
		mods = append(mods, &repoModule{Path: f.Module.Mod.Path, Dir: dir, Rel: filepath.ToSlash(rel), File: f, Command: command})
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(mods, func(a, b *repoModule) int {
		if a.Rel == "." || b.Rel == "." {
			return compareBool(a.Rel != ".", b.Rel != ".")
		}
		return strings.Compare(a.Rel, b.Rel)
	})
	if len(mods) == 0 || mods[0].Rel != "." {
		return nil, fmt.Errorf("%s: no go.mod at the root", root)
	}
	return mods, nil
}

// releasedModules returns the modules of mods that are tagged.
func releasedModules(mods []*repoModule) []*repoModule {
	var out []*repoModule
	for _, m := range mods {
		if m.released() {
			out = append(out, m)
		}
	}
	return out
}

// siblings maps the path of every module of the repository to it.
func siblings(mods []*repoModule) map[string]*repoModule {
	by := make(map[string]*repoModule, len(mods))
	for _, m := range mods {
		by[m.Path] = m
	}
	return by
}

// requiredVersion returns the one version at which the repository's modules
// require each other.
func requiredVersion(mods []*repoModule) (string, error) {
	by := siblings(mods)
	var version string
	for _, m := range mods {
		for _, r := range m.File.Require {
			if by[r.Mod.Path] == nil {
				continue
			}
			if version == "" {
				version = r.Mod.Version
			} else if r.Mod.Version != version {
				return "", fmt.Errorf("%s/go.mod requires %s at %s, another module at %s: the modules require each other at one version", m.Rel, r.Mod.Path, r.Mod.Version, version)
			}
		}
	}
	if version == "" {
		return "", errors.New("no module requires another: give the version with -version")
	}
	return version, nil
}

// checkModules reports every reason the modules cannot be released at
// version: a requirement of a sibling at another version (a pseudo-version
// above all, which no proxy serves), a replacement that does not point at
// the sibling's folder, a replace or exclude directive in a command module
// (go install PATH@VERSION refuses it), a released module without its
// LICENSE.
func checkModules(mods []*repoModule, version string) error {
	by := siblings(mods)
	var errs []error
	for _, m := range mods {
		for _, r := range m.File.Require {
			if by[r.Mod.Path] == nil || r.Mod.Version == version {
				continue
			}
			if module.IsPseudoVersion(r.Mod.Version) {
				errs = append(errs, fmt.Errorf("%s/go.mod requires %s at the pseudo-version %s, which no user can download: require %s", m.Rel, r.Mod.Path, r.Mod.Version, version))
			} else {
				errs = append(errs, fmt.Errorf("%s/go.mod requires %s at %s, not at the release version %s", m.Rel, r.Mod.Path, r.Mod.Version, version))
			}
		}
		for _, r := range m.File.Replace {
			sib := by[r.Old.Path]
			if sib == nil {
				continue
			}
			target := filepath.Clean(filepath.Join(m.Dir, filepath.FromSlash(r.New.Path)))
			if r.New.Version != "" || target != sib.Dir {
				errs = append(errs, fmt.Errorf("%s/go.mod replaces %s with %s, not with its folder %s", m.Rel, r.Old.Path, r.New, sib.Rel))
			}
		}
		if !m.released() {
			continue
		}
		if m.Command && (len(m.File.Replace) > 0 || len(m.File.Exclude) > 0) {
			errs = append(errs, fmt.Errorf("%s/go.mod has a replace or exclude directive, which go install %s@%s refuses: name the repository's folders in %s/go.work instead", m.Rel, m.Path, version, m.Rel))
		}
		if _, err := os.Stat(filepath.Join(m.Dir, "LICENSE")); err != nil {
			errs = append(errs, fmt.Errorf("%s has no LICENSE: its module zip would carry none, and pkg.go.dev shows no documentation for it", m.Rel))
		}
	}
	return errors.Join(errs...)
}

// compareBool orders false before true.
func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}
