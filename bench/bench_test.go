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
	for _, want := range []string{"## Targets", "round trips per fresh Do", "duplicate side effects with idem", "gRPC: round trips per replay",
		"allocations per Do replay", "allocations per fresh Do", "allocations g.Middleware adds per fresh request",
		"wake-up lag after completion", "commands sent by a waiter", "without SPUBLISH", "Sealing: WithSealer vs plain",
		"auto-pipelining: duplicate side effects", "Auto-pipelining: g.Middleware",
		"idem.Do replays with WithAutoPipeline / the GET-first lock pattern's", "idem.Do fresh with WithAutoPipeline / go-redsync"} {
		require.Contains(t, string(md), want)
	}
	require.NotContains(t, string(md), "not measured")
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

// TestWithoutPublish: the comparison script is complete.lua less its
// notification block, nothing else.
func TestWithoutPublish(t *testing.T) {
	src, err := os.ReadFile(filepath.FromSlash(completeScriptPath))
	require.NoError(t, err)
	out, err := withoutPublish(string(src))
	require.NoError(t, err)
	for line := range strings.SplitSeq(out, "\n") {
		if l := strings.TrimSpace(line); !strings.HasPrefix(l, "--") {
			require.NotContains(t, l, "SPUBLISH")
		}
	}
	require.Equal(t, strings.Count(string(src), "\n")-6, strings.Count(out, "\n"),
		"the if, the SPUBLISH, the check of its reply and the two ends")
	require.True(t, strings.HasSuffix(out, "\nreturn 1\n"), "the script still ends with its reply")
	_, err = withoutPublish("return 1\n")
	require.Error(t, err)
}

// TestRespCounter: commands are counted by name however the writes split
// them.
func TestRespCounter(t *testing.T) {
	c := &cmdCounter{}
	p := respCounter{c: c}
	wire := "*2\r\n$5\r\nhello\r\n$1\r\n3\r\n*3\r\n$7\r\nEVALSHA\r\n$4\r\na\r\nb\r\n$0\r\n\r\n*2\r\n$10\r\nSSUBSCRIBE\r\n$4\r\nk:n\n\r\n"
	for i := 0; i < len(wire); i += 3 {
		p.feed([]byte(wire[i:min(i+3, len(wire))]))
	}
	require.Equal(t, map[string]int{"HELLO": 1, "EVALSHA": 1, "SSUBSCRIBE": 1}, c.snapshot())
}
