package main

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem"
)

// maxBody bounds what the receiver reads to check a signature; idem's
// WithMaxRequestBody has the same default.
const maxBody = 1 << 20

// tolerance is how old a signed timestamp may be, as both schemes advise.
const tolerance = 5 * time.Minute

// receiver handles webhooks from two senders: Stripe-style events (the key
// is the event's id in the body) and Standard Webhooks (the key is the
// webhook-id header). Each delivery's signature is checked before idem's
// middleware, so a forged delivery never reaches Redis.
type receiver struct {
	stripeSecret   []byte // Stripe signs with the whole "whsec_…" string
	standardSecret []byte // Standard Webhooks: the bytes after "whsec_", base64-decoded
	now            func() time.Time

	mu        sync.Mutex
	fulfilled map[string]int // side effects, by sender and event id
}

func newReceiver(stripeSecret, standardSecret string) (*receiver, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(standardSecret, "whsec_"))
	if err != nil {
		return nil, fmt.Errorf("standard webhooks secret: %w", err)
	}
	return &receiver{stripeSecret: []byte(stripeSecret), standardSecret: key, now: time.Now, fulfilled: map[string]int{}}, nil
}

// routes returns the receiver's handler on g. Each sender gets a scope of
// its own: two senders' equal ids never meet.
func (v *receiver) routes(g *idem.Guard) http.Handler {
	mux := http.NewServeMux()
	stripe := g.Middleware(
		idem.WithScope(func(*http.Request) string { return "stripe" }),
		idem.WithKeyFunc(idem.KeyFromJSON("/id")),
		// pending_webhooks changes between deliveries of one event.
		idem.WithFingerprint(idem.FingerprintJSON("/type", "/data")),
	)
	standard := g.Middleware(
		idem.WithScope(func(*http.Request) string { return "standard" }),
		idem.WithKeyHeader("webhook-id"),
	)
	mux.Handle("POST /webhooks/stripe", v.verify(v.stripeValid, stripe(v.fulfil("stripe"))))
	mux.Handle("POST /webhooks/standard", v.verify(v.standardValid, standard(v.fulfil("standard"))))
	return mux
}

// verify reads the body, checks its signature with valid, and hands the
// body on to next; a bad signature gets 400 and nothing else happens.
func (v *receiver) verify(valid func(h http.Header, body []byte) error, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			http.Error(w, "body unreadable or too large", http.StatusRequestEntityTooLarge)
			return
		}
		if err := valid(r.Header, body); err != nil {
			http.Error(w, "signature invalid: "+err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

// stripeValid checks a Stripe-Signature header: "t=<unix>,v1=<hex>", v1 the
// HMAC-SHA256 of "<t>.<body>" under the endpoint's secret.
func (v *receiver) stripeValid(h http.Header, body []byte) error {
	var ts string
	var sigs [][]byte
	for part := range strings.SplitSeq(h.Get("Stripe-Signature"), ",") {
		k, val, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = val
		case "v1":
			if sig, err := hex.DecodeString(val); err == nil {
				sigs = append(sigs, sig)
			}
		}
	}
	return v.check(v.stripeSecret, ts, ts+".", body, sigs)
}

// standardValid checks Standard Webhooks' headers: webhook-signature holds
// "v1,<base64>" entries, each the HMAC-SHA256 of
// "<webhook-id>.<webhook-timestamp>.<body>".
func (v *receiver) standardValid(h http.Header, body []byte) error {
	var sigs [][]byte
	for entry := range strings.FieldsSeq(h.Get("webhook-signature")) {
		if val, ok := strings.CutPrefix(entry, "v1,"); ok {
			if sig, err := base64.StdEncoding.DecodeString(val); err == nil {
				sigs = append(sigs, sig)
			}
		}
	}
	ts := h.Get("webhook-timestamp")
	return v.check(v.standardSecret, ts, h.Get("webhook-id")+"."+ts+".", body, sigs)
}

// check reports whether one of sigs is the HMAC of prefix and body under
// secret, signed no earlier than the tolerance.
func (v *receiver) check(secret []byte, ts, prefix string, body []byte, sigs [][]byte) error {
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errors.New("no timestamp")
	}
	if age := v.now().Sub(time.Unix(unix, 0)); age > tolerance || age < -tolerance {
		return errors.New("timestamp outside the tolerance")
	}
	want := sign(secret, prefix, body)
	for _, sig := range sigs {
		if hmac.Equal(sig, want) {
			return nil
		}
	}
	return errors.New("no matching signature")
}

// sign returns the HMAC-SHA256 of prefix and body under secret.
func sign(secret []byte, prefix string, body []byte) []byte {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(prefix))
	mac.Write(body)
	return mac.Sum(nil)
}

// fulfil is the side effect: it fulfils the order an event names, once per
// event thanks to idem.
func (v *receiver) fulfil(sender string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ev struct {
			ID   string `json:"id"`
			Type string `json:"type"`
		}
		if err := json.NewDecoder(r.Body).Decode(&ev); err != nil {
			http.Error(w, "event does not decode", http.StatusBadRequest)
			return
		}
		if ev.ID == "" {
			ev.ID = r.Header.Get("webhook-id")
		}
		time.Sleep(20 * time.Millisecond) // the fulfilment takes time: redeliveries overlap it
		v.mu.Lock()
		v.fulfilled[sender+" "+ev.ID]++
		n := len(v.fulfilled)
		v.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"fulfilled":%q,"type":%q,"fulfilment":%d}`, ev.ID, ev.Type, n)
	})
}

// effects returns how many events were fulfilled, and how often in all.
func (v *receiver) effects() (events, total int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, n := range v.fulfilled {
		total += n
	}
	return len(v.fulfilled), total
}
