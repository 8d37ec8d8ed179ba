package main

import (
	"archive/zip"
	"bytes"
	"errors"
	"fmt"
	"go/token"
	"go/types"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"golang.org/x/exp/apidiff"
	"golang.org/x/mod/semver"
	"golang.org/x/tools/go/gcexportdata"
	"golang.org/x/tools/go/packages"
)

// An api is the exported API of one module: its importable packages.
type api struct {
	Path     string           // module path
	Packages []*types.Package // sorted by path
}

// loadAPI type-checks the importable packages of the module in dir: not main,
// not internal.
func loadAPI(fset *token.FileSet, dir string) (*api, error) {
	cfg := &packages.Config{
		Mode:       packages.NeedName | packages.NeedTypes | packages.NeedModule,
		Dir:        dir,
		Env:        append(os.Environ(), "GOWORK=off", goflags("-trimpath")),
		Fset:       fset,
		BuildFlags: []string{"-trimpath"},
	}
	loaded, err := packages.Load(cfg, "./...")
	if err != nil {
		return nil, err
	}
	a := &api{}
	var errs []error
	for _, p := range loaded {
		for _, e := range p.Errors {
			errs = append(errs, e)
		}
		if p.Module != nil && a.Path == "" {
			a.Path = p.Module.Path
		}
		if p.Name == "main" || p.Types == nil || internal(p.PkgPath) {
			continue
		}
		a.Packages = append(a.Packages, p.Types)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	sort.Slice(a.Packages, func(i, j int) bool { return a.Packages[i].Path() < a.Packages[j].Path() })
	return a, nil
}

// internal reports whether an import path is importable only inside its tree.
func internal(path string) bool {
	return path == "internal" || strings.HasPrefix(path, "internal/") || strings.Contains(path, "/internal/") || strings.HasSuffix(path, "/internal")
}

// writeAPI writes a's export data as a zip (one entry "module", then one
// PATH.x per package), the form apidiff -m -w writes.
func writeAPI(w io.Writer, fset *token.FileSet, a *api) error {
	z := zip.NewWriter(w)
	entry, err := z.Create("module")
	if err != nil {
		return err
	}
	if _, err := io.WriteString(entry, a.Path); err != nil {
		return err
	}
	for _, p := range a.Packages {
		entry, err := z.Create(p.Path() + ".x")
		if err != nil {
			return err
		}
		if err := gcexportdata.Write(entry, fset, p); err != nil {
			return fmt.Errorf("%s: %w", p.Path(), err)
		}
	}
	return z.Close()
}

// readAPI reads what writeAPI wrote.
func readAPI(fset *token.FileSet, file string) (*api, error) {
	z, err := zip.OpenReader(file)
	if err != nil {
		return nil, err
	}
	defer z.Close()
	a := &api{}
	for _, f := range z.File {
		r, err := f.Open()
		if err != nil {
			return nil, err
		}
		data, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			return nil, err
		}
		if f.Name == "module" {
			a.Path = string(data)
			continue
		}
		path, ok := strings.CutSuffix(f.Name, ".x")
		if !ok {
			return nil, fmt.Errorf("%s: unexpected entry %q", file, f.Name)
		}
		p, err := gcexportdata.Read(bytes.NewReader(data), fset, map[string]*types.Package{}, path)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", file, path, err)
		}
		a.Packages = append(a.Packages, p)
	}
	if a.Path == "" {
		return nil, fmt.Errorf("%s: no module path", file)
	}
	return a, nil
}

// A break is an incompatible change of the API.
type apiBreak struct {
	Pkg     *types.Package // the package, as it was
	Name    string         // what changed, as apidiff names it ("" for the package itself)
	Message string
}

func (b apiBreak) String() string {
	if b.Name == "" {
		return fmt.Sprintf("package %s: %s", b.Pkg.Path(), b.Message)
	}
	return fmt.Sprintf("%s.%s: %s", b.Pkg.Path(), b.Name, b.Message)
}

// breaks returns the incompatible changes from old to new, package by package.
func breaks(old, new *api) []apiBreak {
	byPath := map[string]*types.Package{}
	for _, p := range new.Packages {
		byPath[p.Path()] = p
	}
	var out []apiBreak
	for _, op := range old.Packages {
		np := byPath[op.Path()]
		if np == nil {
			out = append(out, apiBreak{Pkg: op, Message: "removed"})
			continue
		}
		for _, c := range apidiff.Changes(op, np).Changes {
			if c.Compatible {
				continue
			}
			name, msg, _ := strings.Cut(c.Message, ": ")
			out = append(out, apiBreak{Pkg: op, Name: name, Message: msg})
		}
	}
	return out
}

// unlisted returns the breaks that the changelog's text does not name.
func unlisted(bs []apiBreak, text string) []apiBreak {
	var out []apiBreak
	for _, b := range bs {
		if b.Name == "" {
			if !strings.Contains(text, b.Pkg.Path()) {
				out = append(out, b)
			}
			continue
		}
		if !lists(text, b.Pkg.Name(), b.Name) {
			out = append(out, b)
		}
	}
	return out
}

// baselineDir returns the folder of the newest baseline under root/api and
// its version, or "" when there is none.
func baselineDir(root string) (dir, version string, err error) {
	entries, err := os.ReadDir(filepath.Join(root, "api"))
	if errors.Is(err, os.ErrNotExist) {
		return "", "", nil
	}
	if err != nil {
		return "", "", err
	}
	var versions []string
	for _, e := range entries {
		if e.IsDir() && semver.IsValid(e.Name()) {
			versions = append(versions, e.Name())
		}
	}
	if len(versions) == 0 {
		return "", "", nil
	}
	semver.Sort(versions)
	version = versions[len(versions)-1]
	return filepath.Join(root, "api", version), version, nil
}

// baselineFile names the file of a module's API in a baseline folder: the
// module's folder with slashes as dashes, "idem" for the root.
func baselineFile(m *repoModule) string {
	if m.Rel == "." {
		return "idem"
	}
	return strings.ReplaceAll(m.Rel, "/", "-")
}

// apiText lists a's exported names, one a line, for people to read: the
// export data beside it is what the check compares.
func apiText(a *api) string {
	var b strings.Builder
	for _, p := range a.Packages {
		qual := func(other *types.Package) string {
			if other == p {
				return ""
			}
			return other.Name()
		}
		prefix := "pkg " + p.Path() + ", "
		scope := p.Scope()
		for _, name := range scope.Names() {
			obj := scope.Lookup(name)
			if !obj.Exported() {
				continue
			}
			tn, ok := obj.(*types.TypeName)
			if !ok {
				fmt.Fprintf(&b, "%s%s\n", prefix, types.ObjectString(obj, qual))
				continue
			}
			b.WriteString(prefix + typeLines(tn, qual))
			for _, line := range memberLines(tn, qual) {
				b.WriteString(prefix + line + "\n")
			}
		}
	}
	return b.String()
}

// typeLines describes a type name: a struct or an interface by its kind
// alone (its exported fields and methods follow on lines of their own).
func typeLines(tn *types.TypeName, qual types.Qualifier) string {
	if !tn.IsAlias() {
		switch tn.Type().Underlying().(type) {
		case *types.Struct:
			return "type " + tn.Name() + typeParams(tn, qual) + " struct\n"
		case *types.Interface:
			return "type " + tn.Name() + typeParams(tn, qual) + " interface\n"
		}
	}
	return types.ObjectString(tn, qual) + "\n"
}

// typeParams writes a generic type's parameters.
func typeParams(tn *types.TypeName, qual types.Qualifier) string {
	named, ok := tn.Type().(*types.Named)
	if !ok || named.TypeParams().Len() == 0 {
		return ""
	}
	s := types.TypeString(named, qual)
	if i := strings.Index(s, "["); i >= 0 {
		return s[i:]
	}
	return ""
}

// memberLines lists a type's exported fields, interface methods and methods.
func memberLines(tn *types.TypeName, qual types.Qualifier) []string {
	var lines []string
	switch u := tn.Type().Underlying().(type) {
	case *types.Struct:
		for f := range u.Fields() {
			if f.Exported() {
				lines = append(lines, "type "+tn.Name()+" struct, "+f.Name()+" "+types.TypeString(f.Type(), qual))
			}
		}
	case *types.Interface:
		for m := range u.Methods() {
			if m.Exported() {
				lines = append(lines, "type "+tn.Name()+" interface, "+m.Name()+strings.TrimPrefix(types.TypeString(m.Type(), qual), "func"))
			}
		}
	}
	if tn.IsAlias() {
		return lines
	}
	ms := types.NewMethodSet(types.NewPointer(tn.Type()))
	var methods []string
	for sel := range ms.Methods() {
		m := sel.Obj().(*types.Func)
		if !m.Exported() || m.Pkg() != tn.Pkg() {
			continue
		}
		if _, isIface := tn.Type().Underlying().(*types.Interface); isIface {
			continue
		}
		sig := m.Type().(*types.Signature)
		methods = append(methods, "method ("+types.TypeString(sig.Recv().Type(), qual)+") "+m.Name()+strings.TrimPrefix(types.TypeString(sig, qual), "func"))
	}
	slices.Sort(methods)
	return append(lines, methods...)
}
