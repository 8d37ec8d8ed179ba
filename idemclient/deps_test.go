package idemclient_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDependencies: a program that only calls others through idemclient
// links neither go-redis nor the root package (which imports it): its
// dependencies are the standard library and internal/wire.
func TestDependencies(t *testing.T) {
	goTool, err := exec.LookPath("go")
	require.NoError(t, err, "the go command is needed to list the package's dependencies")
	out, err := exec.Command(goTool, "list", "-deps", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/idemkit/idem/idemclient", "go list ran on this package")
	for _, dep := range deps {
		require.False(t, strings.HasPrefix(dep, "github.com/redis/go-redis"), "idemclient depends on %s", dep)
		require.NotEqual(t, "github.com/idemkit/idem", dep, "idemclient depends on the root package, and so on go-redis")
		if strings.Contains(strings.SplitN(dep, "/", 2)[0], ".") {
			require.True(t, strings.HasPrefix(dep, "github.com/idemkit/idem/"), "idemclient depends on %s: only the standard library and internal/wire are expected", dep)
		}
	}
}
