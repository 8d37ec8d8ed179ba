package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/paydemo"
	"github.com/idemkit/idem/idemclient"
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

func TestServeReplica(t *testing.T) {
	opts, stop, err := paydemo.RedisOptions("")
	require.NoError(t, err)
	t.Cleanup(stop)
	p := paydemo.NewProvider(0)
	db := testDatabase(t, "")
	r, err := paydemo.StartReplica("replica 1", "127.0.0.1:0", opts, db, p, time.Second, paydemo.Discard, t.Logf)
	require.NoError(t, err)
	t.Cleanup(r.Close)

	send := func(method, path, apiKey, key, body string) *http.Response {
		req, err := http.NewRequest(method, r.URL()+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	key := idemclient.NewKey()
	first := send("POST", "/payments", "sk_test_alice", key, `{"amount":100,"currency":"EUR"}`)
	require.Equal(t, http.StatusCreated, first.StatusCode)
	again := send("POST", "/payments", "sk_test_alice", key, `{"currency":"EUR","amount":100}`)
	require.Equal(t, http.StatusCreated, again.StatusCode)
	require.Equal(t, "true", again.Header.Get(idem.ReplayedHeader))
	require.Equal(t, first.Header.Get("Location"), again.Header.Get("Location"))
	require.Equal(t, 1, p.Charges())

	// Bob's equal key is his own operation.
	bob := send("POST", "/payments", "sk_test_bob", key, `{"amount":100,"currency":"EUR"}`)
	require.Equal(t, http.StatusCreated, bob.StatusCode)
	require.Empty(t, bob.Header.Get(idem.ReplayedHeader))
	require.Equal(t, 2, p.Charges())

	require.Equal(t, http.StatusBadRequest, send("POST", "/payments", "sk_test_alice", "", `{}`).StatusCode)
	require.Equal(t, http.StatusBadRequest, send("POST", "/payments", "sk_test_alice", idemclient.NewKey(), `{"amount":-1}`).StatusCode)
	require.Equal(t, http.StatusUnauthorized, send("POST", "/payments", "nope", key, ``).StatusCode)
	require.Equal(t, http.StatusOK, send("GET", first.Header.Get("Location"), "sk_test_alice", "", ``).StatusCode)
	require.Equal(t, http.StatusNotFound, send("GET", first.Header.Get("Location"), "sk_test_bob", "", ``).StatusCode)
	booked, err := db.Entries(context.Background())
	require.NoError(t, err)
	require.Equal(t, 2, booked, "Alice's payment and Bob's")
}

// TestMain stops the shared PostgreSQL when the tests are done.
func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	os.Exit(code)
}
