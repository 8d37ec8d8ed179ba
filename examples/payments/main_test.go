package main

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redistest"
)

func TestDemo(t *testing.T) {
	for name, opts := range map[string]func(t *testing.T) *redis.Options{
		"miniredis": func(t *testing.T) *redis.Options {
			opts, stop, err := redisOptions("")
			require.NoError(t, err)
			t.Cleanup(stop)
			return opts
		},
		"redis-server": func(t *testing.T) *redis.Options {
			opts, _, err := redisOptions("redis://" + redistest.Start(t).Addr() + "/0")
			require.NoError(t, err)
			return opts
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			require.NoError(t, runDemo(&out, opts(t)), out.String())
			s := out.String()
			t.Log("\n" + s)
			for _, want := range []string{
				"Idempotent-Replayed: true",
				"but the answer is lost on the way",
				"422 Idempotency key reused",
				"dies (kill -9)",
				"attempt 2 finds charge ch_0004 at the provider: not charging again",
				`200 OK {"id":"ch_0004"`,
				"4 intents, 4 charges",
			} {
				require.Contains(t, s, want)
			}
		})
	}
}

func TestServeReplica(t *testing.T) {
	opts, stop, err := redisOptions("")
	require.NoError(t, err)
	t.Cleanup(stop)
	p := NewProvider(0)
	r, err := startReplica("replica 1", "127.0.0.1:0", opts, p, time.Second, discard, t.Logf)
	require.NoError(t, err)
	t.Cleanup(r.close)

	send := func(method, path, apiKey, key, body string) *http.Response {
		req, err := http.NewRequest(method, r.url+path, strings.NewReader(body))
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
	key := idem.NewKey()
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
	require.Equal(t, http.StatusBadRequest, send("POST", "/payments", "sk_test_alice", idem.NewKey(), `{"amount":-1}`).StatusCode)
	require.Equal(t, http.StatusUnauthorized, send("POST", "/payments", "nope", key, ``).StatusCode)
	require.Equal(t, http.StatusOK, send("GET", first.Header.Get("Location"), "sk_test_alice", "", ``).StatusCode)
	require.Equal(t, http.StatusNotFound, send("GET", first.Header.Get("Location"), "sk_test_bob", "", ``).StatusCode)
}
