package main

import (
	"archive/zip"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

// buildProxy writes the released modules of mods at version into dir in the
// layout of a module proxy (path/@v/list, .info, .mod, .zip), which the go
// command reads through GOPROXY=file://dir. Each zip is made from the
// module's folder as the go command makes it from a tag, and must carry a
// LICENSE.
func buildProxy(dir string, mods []*repoModule, version string) error {
	for _, m := range releasedModules(mods) {
		if err := addToProxy(dir, m, version); err != nil {
			return fmt.Errorf("%s: %w", m.Rel, err)
		}
	}
	return nil
}

// addToProxy writes one module version into the proxy at dir.
func addToProxy(dir string, m *repoModule, version string) error {
	mv := module.Version{Path: m.Path, Version: version}
	if err := module.Check(mv.Path, mv.Version); err != nil {
		return err
	}
	escaped, err := module.EscapePath(m.Path)
	if err != nil {
		return err
	}
	at := filepath.Join(dir, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		return err
	}
	zipFile := filepath.Join(at, version+".zip")
	f, err := os.Create(zipFile)
	if err != nil {
		return err
	}
	err = modzip.CreateFromDir(f, mv, m.Dir)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("zip: %w", err)
	}
	if err := checkZip(zipFile, mv); err != nil {
		return err
	}
	gomod, err := os.ReadFile(filepath.Join(m.Dir, "go.mod"))
	if err != nil {
		return err
	}
	info, _ := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	for name, data := range map[string][]byte{
		version + ".mod":  gomod,
		version + ".info": info,
		"list":            []byte(version + "\n"),
	} {
		if err := os.WriteFile(filepath.Join(at, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// checkZip reports whether the module zip is one the go command accepts and
// carries a LICENSE at its root.
func checkZip(zipFile string, mv module.Version) error {
	if _, err := modzip.CheckZip(mv, zipFile); err != nil {
		return err
	}
	z, err := zip.OpenReader(zipFile)
	if err != nil {
		return err
	}
	defer z.Close()
	for _, f := range z.File {
		if f.Name == mv.String()+"/LICENSE" {
			return nil
		}
	}
	return fmt.Errorf("the zip of %s carries no LICENSE", mv)
}
