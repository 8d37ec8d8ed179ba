package paydemo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem"
)

// Provider is a fake payment provider, an external system like Stripe or
// Adyen: it charges, counts its charges, and, like the real ones, treats a
// repeated idempotency key as the same charge. It is shared by all replicas.
type Provider struct {
	Latency time.Duration // how long a charge takes

	mu      sync.Mutex
	byKey   map[string]Charge // by the caller's idempotency key
	byID    map[string]Charge
	charges int
}

// Charge is a charge made by the provider.
type Charge struct {
	ID       string `json:"id"`
	Account  string `json:"account"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// NewProvider returns a provider without charges.
func NewProvider(latency time.Duration) *Provider {
	return &Provider{Latency: latency, byKey: map[string]Charge{}, byID: map[string]Charge{}}
}

// Charge charges amount once per idempotency key: a repeated key returns
// the first charge.
func (p *Provider) Charge(ctx context.Context, key, account string, amount int64, currency string) (Charge, error) {
	select {
	case <-ctx.Done():
		return Charge{}, ctx.Err()
	case <-time.After(p.Latency):
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.byKey[key]; ok {
		return c, nil
	}
	p.charges++
	c := Charge{ID: fmt.Sprintf("ch_%04d", p.charges), Account: account, Amount: amount, Currency: currency}
	p.byKey[key], p.byID[c.ID] = c, c
	return c, nil
}

// Find returns the charge made with an idempotency key, if any.
func (p *Provider) Find(key string) (Charge, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.byKey[key]
	return c, ok
}

// Get returns a charge by its id.
func (p *Provider) Get(id string) (Charge, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.byID[id]
	return c, ok
}

// Charges returns how many charges were made.
func (p *Provider) Charges() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.charges
}

// API is the payments API of one replica.
type API struct {
	Name     string
	Provider *Provider
	// Ledger is shared by the replicas: each payment is booked in it.
	Ledger Ledger
	Logf   func(format string, args ...any)
	// AfterCharge, when set, runs between the charge and the booking. The
	// demo uses it to kill a replica at the worst moment.
	AfterCharge func(ctx context.Context)
	// AfterCommit, when set, runs between the booking and the answer.
	AfterCommit func(at *idem.Attempt)
}

// accounts stands in for real authentication: API keys and their accounts.
var accounts = map[string]string{"sk_test_alice": "alice", "sk_test_bob": "bob"}

type accountKey struct{}

// authenticate resolves the caller's account from its API key.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		account, ok := accounts[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
		if !ok {
			problem(w, http.StatusUnauthorized, "Unauthorized", "Send Authorization: Bearer sk_test_alice (or sk_test_bob).")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, account)))
	})
}

func accountOf(r *http.Request) string { s, _ := r.Context().Value(accountKey{}).(string); return s }

// Handler returns the replica's routes. POST /payments is protected by the
// idempotency middleware, scoped by account: two accounts' equal keys never
// meet.
func (a *API) Handler(g *idem.Guard) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /payments", g.Middleware(idem.WithScope(accountOf))(http.HandlerFunc(a.create)))
	mux.HandleFunc("GET /payments/{id}", a.get)
	return authenticate(mux)
}

type paymentRequest struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

type payment struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Status   string `json:"status"`
}

func (a *API) create(w http.ResponseWriter, r *http.Request) {
	at, _ := idem.AttemptFrom(r.Context())
	var in paymentRequest
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Amount <= 0 || len(in.Currency) != 3 {
		// Stored like any answer: the same request gets the same 400.
		problem(w, http.StatusBadRequest, "Invalid payment", `Send {"amount": <positive integer, in cents>, "currency": "EUR"}.`)
		return
	}
	// The ledger books the charge for the operation. A ledger in a
	// database (package idemsql) commits the entry with the operation's
	// outcome: if an earlier attempt already committed (it died before Redis
	// heard of it, or Redis lost the record), the charge does not run and the
	// booked payment is the answer.
	c, ran, err := a.Ledger.Book(r.Context(), at, accountOf(r), func(ctx context.Context) (Charge, error) {
		return a.charge(ctx, at, accountOf(r), in)
	})
	p := payment{ID: c.ID, Amount: c.Amount, Currency: c.Currency, Status: "succeeded"}
	switch {
	case r.Context().Err() != nil:
		return // the replica is gone, or the client
	case errors.Is(err, errProvider):
		// 5xx is not stored: a retry runs again (and finds the charge).
		problem(w, http.StatusBadGateway, "Provider unavailable", "Retry with the same Idempotency-Key.")
		return
	case err != nil:
		a.Logf("%s: attempt %d: %v", a.Name, at.Fence, err)
		problem(w, http.StatusServiceUnavailable, "Ledger unavailable", "Retry with the same Idempotency-Key.")
		return
	case !ran:
		a.Logf("%s: attempt %d finds payment %s committed in the database: answering it", a.Name, at.Fence, p.ID)
	}
	if a.AfterCommit != nil {
		a.AfterCommit(at)
	}
	w.Header().Set("Location", "/payments/"+p.ID)
	writeJSON(w, http.StatusCreated, p)
}

var errProvider = errors.New("payment provider unavailable")

// charge charges the provider once per operation.
func (a *API) charge(ctx context.Context, at *idem.Attempt, account string, in paymentRequest) (Charge, error) {
	var (
		c     Charge
		found bool
	)
	if at.Fence > 1 {
		// An earlier attempt started and did not finish: it may have
		// charged. Ask the provider about this operation before charging.
		if c, found = a.Provider.Find(at.ID); found {
			a.Logf("%s: attempt %d finds charge %s at the provider: not charging again", a.Name, at.Fence, c.ID)
		}
	}
	if !found {
		var err error
		// at.ID is the same in every attempt: the provider's own
		// idempotency key.
		if c, err = a.Provider.Charge(ctx, at.ID, account, in.Amount, in.Currency); err != nil {
			return Charge{}, fmt.Errorf("%w: %w", errProvider, err)
		}
		a.Logf("%s: attempt %d charges %d %s: %s", a.Name, at.Fence, c.Amount, c.Currency, c.ID)
	}
	if a.AfterCharge != nil {
		a.AfterCharge(ctx)
	}
	return c, nil
}

func (a *API) get(w http.ResponseWriter, r *http.Request) {
	c, ok := a.Provider.Get(r.PathValue("id"))
	if !ok || c.Account != accountOf(r) {
		problem(w, http.StatusNotFound, "No such payment", "")
		return
	}
	writeJSON(w, http.StatusOK, payment{ID: c.ID, Amount: c.Amount, Currency: c.Currency, Status: "succeeded"})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func problem(w http.ResponseWriter, code int, title, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "about:blank", "title": title, "status": code, "detail": detail})
}
