package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/examples/internal/paydemo"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
)

func TestDemo(t *testing.T) {
	miniRedis := func(t *testing.T) *redis.Options {
		opts, stop, err := paydemo.RedisOptions("")
		require.NoError(t, err)
		t.Cleanup(stop)
		return opts
	}
	for _, tt := range []struct {
		name  string
		redis func(t *testing.T) *redis.Options
		db    func(t *testing.T) string // -db
	}{
		{name: "miniredis+sqlite", redis: miniRedis, db: func(*testing.T) string { return "" }},
		{name: "redis-server+sqlite", redis: func(t *testing.T) *redis.Options {
			opts, _, err := paydemo.RedisOptions("redis://" + redistest.Start(t).Addr() + "/0")
			require.NoError(t, err)
			return opts
		}, db: func(t *testing.T) string { return filepath.Join(t.TempDir(), "payments.db") }},
		{name: "miniredis+postgres", redis: miniRedis, db: func(t *testing.T) string { return pgtest.Shared(t).CreateDB(t) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := testDatabase(t, tt.db(t))
			var out bytes.Buffer
			require.NoError(t, paydemo.Run(&out, tt.redis(t), db, redisForgets), out.String())
			s := out.String()
			t.Log("\n" + s)
			for _, want := range []string{
				"Idempotent-Replayed: true",
				"but the answer is lost on the way",
				"422 Idempotency key reused",
				"dies (kill -9)",
				"attempt 2 finds charge ch_0004 at the provider: not charging again",
				`200 OK {"id":"ch_0004"`,
				"Redis loses the record of the operation",
				"attempt 1 finds payment ch_0005 committed in the database: answering it",
				"5 intents, 5 charges, 5 ledger entries",
			} {
				require.Contains(t, s, want)
			}
		})
	}
}

// testDatabase opens the database named like -db, closed by t.Cleanup.
func testDatabase(t *testing.T, name string) *database {
	t.Helper()
	db, stop, err := openDatabase(context.Background(), name)
	require.NoError(t, err)
	t.Cleanup(stop)
	return db
}

func TestServeReplica(t *testing.T) { paydemo.CheckReplica(t, testDatabase(t, "")) }

// TestMain stops the shared PostgreSQL when the tests are done.
func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	os.Exit(code)
}
