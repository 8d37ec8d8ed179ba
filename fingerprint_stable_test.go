package idem_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// printStore is a cannedStore that keeps the fingerprint of the last claim.
type printStore struct {
	cannedStore
	mu   sync.Mutex
	last string
}

func (s *printStore) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	s.mu.Lock()
	s.last = c.Fingerprint
	s.mu.Unlock()
	return s.cannedStore.Claim(ctx, id, c)
}

// TestFingerprintsStable pins the fingerprints of requests of every kind.
// A fingerprint is stored with its record: one computed otherwise by a new
// version turns every retry across the deploy into a mismatch (422). A
// change here is a change of the stored format, to be named in the
// CHANGELOG with how to migrate.
func TestFingerprintsStable(t *testing.T) {
	const bodyJSON = `{"b": [1, 2.50, {"d": null, "c": "é"}], "a": true}`
	httpCases := []struct {
		name string
		opts []idem.HTTPOption
		req  req
		want string
	}{
		{"JSON body", nil, req{path: "/pay/x%2Fy?q=1&r", body: bodyJSON, contentType: "application/json"}, "ZAZ8jy4zmzl_QIg55SUQOw"},
		{"JSON body, +json", nil, req{path: "/pay", body: bodyJSON, contentType: "application/vnd.api+json; charset=utf-8"}, "ND7n5y7PRgY08RuVGERGbQ"},
		{"other body", nil, req{path: "/pay?q=1", body: "amount=10&currency=EUR", contentType: "application/x-www-form-urlencoded"}, "08N_RxMf2S71pWjWxNSJgw"},
		{"empty JSON body", nil, req{path: "/pay", contentType: "application/json"}, "Q4LUEDiYLPqD7s2fALUI6Q"},
		{"empty body", nil, req{method: http.MethodPatch, path: "/pay/1"}, "FXhWTRC1keT3dKqPiI9naw"},
		{"FingerprintJSON", []idem.HTTPOption{idem.WithFingerprint(idem.FingerprintJSON("/a", "/b/2"))},
			req{path: "/pay", body: bodyJSON, contentType: "application/json"}, "8Z4a55W2MpKlHtgUw-0ppQ"},
		{"WithFingerprint", []idem.HTTPOption{idem.WithFingerprint(func(*http.Request, []byte) ([]byte, error) { return []byte("abc"), nil })},
			req{path: "/pay", body: bodyJSON}, "9b-TwgwU5DjRPIuetqsuJw"},
	}
	for _, tc := range httpCases {
		s := &printStore{}
		h := idem.New(s, quiet).Middleware(tc.opts...)(benchHandler)
		tc.req.key = "k"
		rec := serve(h, tc.req)
		require.Equal(t, http.StatusCreated, rec.Code, tc.name)
		t.Logf("%s: %q", tc.name, s.last)
		require.Equal(t, tc.want, s.last, tc.name)
	}
	doCases := []struct {
		name string
		req  any
		want string
	}{
		{"Do, a struct", payment{Amount: 1000, Currency: "EUR"}, "-lKMB5Pi7I3H5RrgLZlD8w"},
		{"Do, a string", "order-1042", "J8Du0LlFQL_XHJSOXT_pDQ"},
		{"Do, nil", nil, "dCNOmK_nSY-12vHzasLXig"},
	}
	for _, tc := range doCases {
		s := &printStore{}
		_, err := idem.Do(context.Background(), idem.New(s, quiet), "k", tc.req, okFn("v"))
		require.NoError(t, err)
		t.Logf("%s: %q", tc.name, s.last)
		require.Equal(t, tc.want, s.last, tc.name)
	}
}

// TestDoFingerprintIsCanonical: requests that encode to the same JSON
// document, whatever the order of their fields or the spacing of a raw
// part, have one fingerprint; objects, arrays of them and scalars alike.
func TestDoFingerprintIsCanonical(t *testing.T) {
	// payment's fields, declared in another order: it marshals as
	// {"currency":…,"amount":…}, and a deploy may reorder a struct so.
	type reordered struct {
		Currency string `json:"currency"`
		Amount   int    `json:"amount"`
	}
	same := [][]any{
		{payment{10, "EUR"}, reordered{"EUR", 10}, map[string]any{"currency": "EUR", "amount": 10},
			json.RawMessage(` { "currency" : "EUR", "amount" : 10 } `)},
		{[]payment{{10, "EUR"}}, []reordered{{"EUR", 10}}},
		{10, json.RawMessage(` 10 `)},
		{"EUR", json.RawMessage(`"EUR"`)},
	}
	forEachBackend(t, func(t *testing.T, b *backend) {
		g := b.guard(t)
		ctx := context.Background()
		for i, reqs := range same {
			key := fmt.Sprintf("k%d", i)
			_, err := idem.Do(ctx, g, key, reqs[0], okFn("first"))
			require.NoError(t, err)
			for _, req := range reqs[1:] {
				v, err := idem.Do(ctx, g, key, req, okFn("again"))
				require.NoError(t, err, "%T %v", req, req)
				require.Equal(t, "first", v, "%T %v", req, req)
			}
		}
		// And a request that differs is another.
		_, err := idem.Do(ctx, g, "k0", reordered{"EUR", 11}, okFn("other"))
		require.ErrorIs(t, err, idem.ErrMismatch)
	})
}
