package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/redistest"
)

// TestDemo plays the scenarios of `go run ./examples/webhooks` on miniredis
// and on a real redis-server.
func TestDemo(t *testing.T) {
	for _, tt := range []struct {
		name  string
		redis bool
	}{
		{name: "miniredis"},
		{name: "redis-server", redis: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			url := ""
			if tt.redis {
				url = "redis://" + redistest.Start(t).Addr() + "/0"
			}
			var out bytes.Buffer
			require.NoError(t, run(&out, "", url), out.String())
			s := out.String()
			t.Log("\n" + s)
			for _, want := range []string{
				`200 OK {"fulfilled":"evt_1"`,
				`200 OK (Idempotent-Replayed: true) {"fulfilled":"evt_1"`,
				"422 Unprocessable Entity Idempotency key reused",
				"400 Bad Request signature invalid",
				"Redis keys before and after: 1, 1",
				`200 OK (Idempotent-Replayed: true) {"fulfilled":"msg_1"`,
				"24 of 24 answered 200",
				"3 events received, 3 fulfilments",
			} {
				require.Contains(t, s, want)
			}
		})
	}
}

// claimCounter counts the claims that reach the store.
type claimCounter struct {
	idemstore.Store
	claims atomic.Int64
}

func (c *claimCounter) Claim(ctx context.Context, id string, r idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	c.claims.Add(1)
	return c.Store.Claim(ctx, id, r)
}

// TestSignatureCheckedFirst: a delivery whose signature does not hold gets
// 400; the store is not asked and nothing is fulfilled.
func TestSignatureCheckedFirst(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { rdb.Close() })
	store := &claimCounter{Store: idem.NewRedisStore(rdb)}
	v, err := newReceiver(stripeSecret, standardSecret)
	require.NoError(t, err)
	srv := httptest.NewServer(v.routes(idem.New(store)))
	t.Cleanup(srv.Close)
	s := &sender{url: srv.URL, out: &bytes.Buffer{}}

	now := time.Now()
	body := stripeEvent("evt_9", 100, 1)
	old := now.Add(-10 * time.Minute)
	for name, header := range map[string]map[string]string{
		"no signature":    {},
		"wrong signature": {"Stripe-Signature": "t=" + unix(now) + ",v1=" + strings.Repeat("ab", 32)},
		"another secret":  {"Stripe-Signature": "t=" + unix(now) + ",v1=" + hexSign("whsec_other", unix(now)+".", body)},
		"too old":         {"Stripe-Signature": "t=" + unix(old) + ",v1=" + hexSign(stripeSecret, unix(old)+".", body)},
		"v0 only":         {"Stripe-Signature": "t=" + unix(now) + ",v0=" + hexSign(stripeSecret, unix(now)+".", body)},
	} {
		require.Equal(t, http.StatusBadRequest, s.send("/webhooks/stripe", body, header), name)
	}
	std := `{"type":"ping","data":{}}`
	require.Equal(t, http.StatusBadRequest, s.send("/webhooks/standard", std, map[string]string{
		"webhook-id": "msg_9", "webhook-timestamp": unix(now), "webhook-signature": "v1,AAAA",
	}))
	// Signed for another webhook-id: the id is part of what is signed.
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(standardSecret, "whsec_"))
	require.NoError(t, err)
	forOther := base64.StdEncoding.EncodeToString(sign(key, "msg_8."+unix(now)+".", []byte(std)))
	require.Equal(t, http.StatusBadRequest, s.send("/webhooks/standard", std, map[string]string{
		"webhook-id": "msg_9", "webhook-timestamp": unix(now), "webhook-signature": "v1," + forOther,
	}))
	require.Zero(t, store.claims.Load(), "no forged delivery reached the store")
	require.Equal(t, http.StatusOK, s.standard("msg_9", std, now))
	require.EqualValues(t, 1, store.claims.Load(), "the well-signed delivery reached the store")

	require.Equal(t, http.StatusOK, s.stripe(body, now))
	require.Equal(t, http.StatusOK, s.stripe(stripeEvent("evt_9", 100, 0), now.Add(time.Minute)))
	events, total := v.effects()
	require.Equal(t, 2, events)
	require.Equal(t, 2, total)
}

func hexSign(secret, prefix, body string) string {
	return hex.EncodeToString(sign([]byte(secret), prefix, []byte(body)))
}
