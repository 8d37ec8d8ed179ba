package paydemo

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemclient"
)

// CheckReplica is a test of a replica booking into ledger: a retried
// payment is charged and booked once, another account's equal key is its
// own payment, and bad requests are refused.
func CheckReplica(t *testing.T, ledger Ledger) {
	t.Helper()
	opts, stop, err := RedisOptions("")
	require.NoError(t, err)
	t.Cleanup(stop)
	p := NewProvider(0)
	r, err := StartReplica("replica 1", "127.0.0.1:0", opts, ledger, p, time.Second, Discard, t.Logf)
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
	booked, err := ledger.Entries(context.Background())
	require.NoError(t, err)
	require.Equal(t, 2, booked, "Alice's payment and Bob's")
}
