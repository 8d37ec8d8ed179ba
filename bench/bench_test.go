package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestQuickRun runs the benchmark's -quick logic very briefly (no
// PostgreSQL, no cluster), so that the harness keeps compiling and working.
// It needs redis-server on PATH.
func TestQuickRun(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not on PATH")
	}
	out := t.TempDir()
	cfg, err := parseFlags([]string{"-quick", "-duration", "60ms", "-pg", "off", "-cluster", "off", "-out", out})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, run(ctx, cfg))
	md, err := os.ReadFile(filepath.Join(out, "RESULTS.md"))
	require.NoError(t, err)
	for _, want := range []string{"## Targets", "round trips per fresh Do", "duplicate side effects with idem", "gRPC: round trips per replay", "Sealing: WithSealer vs plain"} {
		require.Contains(t, string(md), want)
	}
	fi, err := os.Stat(filepath.Join(out, "chart.png"))
	require.NoError(t, err)
	require.NotZero(t, fi.Size())
}

func TestHist(t *testing.T) {
	var h hist
	for i := 1; i <= 1000; i++ {
		h.add(time.Duration(i) * time.Microsecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{q: 0.5, want: 500 * time.Microsecond}, {q: 0.99, want: 990 * time.Microsecond}} {
		require.InEpsilon(t, float64(c.want), float64(h.quantile(c.q)), 0.02, "quantile %v", c.q)
	}
}
