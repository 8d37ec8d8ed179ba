package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/examples/internal/paydemo"
	"github.com/idemkit/idem/internal/redistest"
)

// TestDemo plays the demo of the README's first command, with its ledger in
// memory, on miniredis and on a real redis-server.
func TestDemo(t *testing.T) {
	for _, tt := range []struct {
		name  string
		redis string // -redis; "" for miniredis
	}{
		{name: "miniredis"},
		{name: "redis-server", redis: "redis-server"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			url := tt.redis
			if url != "" {
				url = "redis://" + redistest.Start(t).Addr() + "/0"
			}
			opts, stop, err := paydemo.RedisOptions(url)
			require.NoError(t, err)
			t.Cleanup(stop)
			var out bytes.Buffer
			require.NoError(t, paydemo.Run(&out, opts, &paydemo.MemoryLedger{}), out.String())
			s := out.String()
			t.Log("\n" + s)
			for _, want := range []string{
				"tap 1 gets 201, payment ch_0001",
				"tap 2 gets 201, payment ch_0001",
				"Idempotent-Replayed: true",
				"but the answer is lost on the way",
				"422 Idempotency key reused",
				"dies (kill -9)",
				"attempt 2 finds charge ch_0004 at the provider: not charging again",
				`200 OK {"id":"ch_0004"`,
				"4 intents, 4 charges, 4 ledger entries",
			} {
				require.Contains(t, s, want)
			}
		})
	}
}
