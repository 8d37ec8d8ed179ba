package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBatchTable runs the batching scenario alone, very briefly (-quick: 1
// and 8 clients, loopback and with two delays), and checks that its three sections carry
// a fresh and a replay row per client count, without errors.
func TestBatchTable(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not on PATH")
	}
	out := t.TempDir()
	cfg, err := parseFlags([]string{"-quick", "-only", "batching", "-duration", "40ms", "-replay-keys", "50", "-pg", "off", "-cluster", "off", "-out", out})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, run(ctx, cfg))
	b, err := os.ReadFile(filepath.Join(out, "RESULTS.md"))
	require.NoError(t, err)
	md := string(b)
	var secs []string
	at := -1
	for _, title := range []string{"## 13. Batching by client count", "## 13b. Batching by client count", "## 13c. Batching by client count"} {
		i := strings.Index(md, title)
		require.Greater(t, i, at, "%s, after the one before", title)
		if at >= 0 {
			secs = append(secs, md[at:i])
		}
		at = i
	}
	secs = append(secs, md[at:])
	for k, sec := range secs {
		require.Equal(t, 2, strings.Count(sec, "| clients | plain ops/s | batched ops/s |"), "a fresh and a replay table")
		for _, n := range []string{"| 1 |", "| 8 |"} {
			require.Equal(t, 2, strings.Count(sec, "\n"+n), "a fresh and a replay row for %s clients", n)
		}
		for line := range strings.SplitSeq(sec, "\n") {
			if strings.HasPrefix(line, "| 1 |") || strings.HasPrefix(line, "| 8 |") {
				require.True(t, strings.HasSuffix(line, "| 0 |"), "no errors: %s", line)
			}
		}
		if k > 0 {
			require.Contains(t, sec, "measured mean delay per round trip")
		}
	}
}

// TestPairedRounds: rounds are compared with the round of the baseline that
// ran beside them.
func TestPairedRounds(t *testing.T) {
	base := &variant{rounds: []float64{100, 200, 100, 0}}
	v := &variant{rounds: []float64{150, 100, 100, 50, 70}}
	ahead, lo, hi := pairedRounds(base, v)
	require.Equal(t, 1, ahead, "only round 1 is ahead; equal is not ahead, a zero baseline round is skipped")
	require.InDelta(t, 0.5, lo, 1e-9)
	require.InDelta(t, 1.5, hi, 1e-9)
}
