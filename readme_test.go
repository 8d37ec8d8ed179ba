package idem_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadmeExample keeps the README's first example equal to the
// quickstart program, which the build compiles.
func TestReadmeExample(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	src, err := os.ReadFile("examples/quickstart/main.go")
	require.NoError(t, err)
	body := string(src)
	body = body[strings.Index(body, "func main() {"):]
	require.Contains(t, string(readme), body, "README's example differs from examples/quickstart/main.go")
}
