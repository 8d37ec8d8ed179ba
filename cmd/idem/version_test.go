package main

import (
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestVersion: idem version, -version and --version print the module's
// version and the Go version on one line, and take no Redis; this build,
// in the repository, has no version of its own: (devel).
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"-version"}, {"--version"}} {
		code, out, errOut := cli(t, args...)
		require.Equal(t, exitOK, code, errOut)
		require.Empty(t, errOut)
		require.Equal(t, "idem (devel) "+runtime.Version()+"\n", out, args)
	}
	code, _, errOut := cli(t, "version", "extra")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "version takes no arguments")
}

func TestVersionLine(t *testing.T) {
	dep := func(path, version string, replace *debug.Module) *debug.Module {
		return &debug.Module{Path: path, Version: version, Replace: replace}
	}
	tests := []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{name: "go install cmd/idem@v0.1.0",
			bi:   &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: module, Version: "v0.1.0"}},
			want: "idem v0.1.0 go1.26.8"},
		{name: "in the repository",
			bi:   &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: module, Version: "(devel)"}},
			want: "idem (devel) go1.26.8"},
		{name: "go tool idem in another module",
			bi: &debug.BuildInfo{GoVersion: "go1.27.3", Main: debug.Module{Path: "example.com/app", Version: "(devel)"},
				Deps: []*debug.Module{dep("github.com/redis/go-redis/v9", "v9.23.0", nil), dep(module, "v0.1.2", nil)}},
			want: "idem v0.1.2 go1.27.3"},
		{name: "replaced by a directory",
			bi: &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "example.com/app"},
				Deps: []*debug.Module{dep(module, "v0.1.0", dep("../idem/cmd/idem", "", nil))}},
			want: "idem (devel) go1.26.8"},
		{name: "replaced by a fork",
			bi: &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "example.com/app"},
				Deps: []*debug.Module{dep(module, "v0.1.0", dep("example.com/fork", "v0.1.1", nil))}},
			want: "idem v0.1.1 go1.26.8"},
		{name: "no version recorded", bi: &debug.BuildInfo{Main: debug.Module{Path: module}},
			want: "idem (devel) " + runtime.Version()},
		{name: "no build information", want: "idem (devel) " + runtime.Version()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, versionLine(tt.bi))
		})
	}
}
