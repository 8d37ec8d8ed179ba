package main

import (
	"context"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
)

// A command module holds commands only (every package is main), such as
// cmd/idem. Users install it with go install PATH@VERSION, which refuses a
// module whose go.mod has a replace or exclude directive, so its go.mod
// names the repository's modules it requires at the release version and
// nothing more; development inside the repository reaches their folders
// through the go.work beside it. It has no API to compare and no library
// package to import.

// commandsOnly reports whether every Go package in the module at dir (not
// counting tests, testdata and nested modules) is a main package, and there
// is at least one.
func commandsOnly(dir string) (bool, error) {
	fset := token.NewFileSet()
	found, other := false, false
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path == dir {
				return nil
			}
			if name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // a module of its own
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.PackageClauseOnly)
		if err != nil {
			return err
		}
		if f.Name.Name == "main" {
			found = true
		} else {
			other = true
		}
		return nil
	})
	return found && !other, err
}

// tidyCommand runs go mod tidy in a command module: with a replace of each
// sibling it requires by its folder while tidy runs, then without them
// again.
func tidyCommand(ctx context.Context, m *repoModule, mods []*repoModule) error {
	file := filepath.Join(m.Dir, "go.mod")
	orig, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	f, err := modfile.Parse(file, orig, nil)
	if err != nil {
		return err
	}
	by := siblings(mods)
	var replaced []string
	for _, r := range f.Require {
		sib := by[r.Mod.Path]
		if sib == nil {
			continue
		}
		rel, err := filepath.Rel(m.Dir, sib.Dir)
		if err != nil {
			return err
		}
		if err := f.AddReplace(r.Mod.Path, "", filepath.ToSlash(rel), ""); err != nil {
			return err
		}
		replaced = append(replaced, r.Mod.Path)
	}
	if err := writeModFile(file, f); err != nil {
		return err
	}
	tidyErr := goIn(ctx, m.Dir, "mod", "tidy")
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if f, err = modfile.Parse(file, data, nil); err != nil {
		return err
	}
	for _, p := range replaced {
		if err := f.DropReplace(p, ""); err != nil {
			return err
		}
	}
	if err := writeModFile(file, f); err != nil {
		return err
	}
	if tidyErr != nil {
		return fmt.Errorf("%s: %w", m.Rel, tidyErr)
	}
	return nil
}

// writeModFile writes f to file.
func writeModFile(file string, f *modfile.File) error {
	f.Cleanup()
	data, err := f.Format()
	if err != nil {
		return err
	}
	return os.WriteFile(file, data, 0o644)
}

// workReplacesAt rewrites the version of every replace of a sibling in the
// repository's go.work to version. A command module requires its siblings
// without a replace directive, so the workspace names the folder of each
// one no other module replaces, at the version required.
func workReplacesAt(root string, mods []*repoModule, version string) error {
	file := filepath.Join(root, "go.work")
	data, err := os.ReadFile(file)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	w, err := modfile.ParseWork(file, data, nil)
	if err != nil {
		return err
	}
	by := siblings(mods)
	changed := false
	for _, r := range slices.Clone(w.Replace) {
		old, new := r.Old, r.New // DropReplace clears r
		if by[old.Path] == nil || old.Version == "" || old.Version == version {
			continue
		}
		if err := w.DropReplace(old.Path, old.Version); err != nil {
			return err
		}
		if err := w.AddReplace(old.Path, version, new.Path, new.Version); err != nil {
			return err
		}
		changed = true
	}
	if !changed {
		return nil
	}
	w.Cleanup()
	if err := os.WriteFile(file, modfile.Format(w.Syntax), 0o644); err != nil {
		return err
	}
	fmt.Printf("go.work: replaces the repository's modules at %s\n", version)
	return nil
}
