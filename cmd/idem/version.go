package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// module is the module of the idem command, a module of its own.
const module = "github.com/idemkit/idem/cmd/idem"

// printVersion writes the version line of idem version.
func printVersion(w io.Writer) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	fmt.Fprintln(w, versionLine(bi))
}

// versionLine returns "idem VERSION GOVERSION": the version of the
// command's module in the binary (the main module's when the binary was
// built in idem's repository or installed with go install; the required
// one when it was built from another module, as a tool of that module or
// with go run or go build), "(devel)" when the build recorded none, and the
// Go version that built it.
func versionLine(bi *debug.BuildInfo) string {
	version, goVersion := "(devel)", runtime.Version()
	if bi == nil {
		return "idem " + version + " " + goVersion
	}
	if bi.GoVersion != "" {
		goVersion = bi.GoVersion
	}
	m := &bi.Main
	if m.Path != module {
		m = nil
		for _, d := range bi.Deps {
			if d.Path == module {
				m = d
			}
		}
	}
	if m != nil && m.Replace != nil {
		m = m.Replace
	}
	if m != nil && m.Version != "" {
		version = m.Version
	}
	return "idem " + version + " " + goVersion
}
