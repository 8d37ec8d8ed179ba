package paydemo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemclient"
)

// Scenario is a scenario played after the shared ones; n is its number.
type Scenario func(d *Demo, n int) error

// Run plays the design's scenarios against three replicas sharing one
// Redis and one ledger, through a load balancer, with the retrying client
// transport, then the scenarios in more, and prints what happened. It
// returns an error if a scenario did not end as the design says it must.
func Run(out io.Writer, opts *redis.Options, ledger Ledger, more ...Scenario) error {
	const lease = time.Second // short, so that a dead replica's key is free soon
	pr := &printer{w: out}
	provider := NewProvider(300 * time.Millisecond)
	var replicas []*Replica
	for i := range 3 {
		r, err := StartReplica(fmt.Sprintf("replica %d", i+1), "127.0.0.1:0", opts, ledger, provider, lease, Discard, pr.note)
		if err != nil {
			return err
		}
		defer r.Close()
		replicas = append(replicas, r)
	}
	lb := &balancer{replicas: replicas, pr: pr}
	client := &http.Client{
		Transport: idemclient.NewTransport(lb, idemclient.WithBackoff(50*time.Millisecond, 500*time.Millisecond)),
		Timeout:   30 * time.Second,
	}
	defer lb.transport.CloseIdleConnections()
	d := &Demo{pr: pr, client: client, lb: lb, replicas: replicas, provider: provider, ledger: ledger}
	d.hooks()
	pay, charges := d.Pay, d.Tally

	pr.printf("idem payments demo: 3 replicas behind a load balancer share one Redis (%s)\n", opts.Addr)
	pr.printf("and %s; lease %v.\n", ledger, lease)
	pr.printf("The client is idemclient.NewTransport: same key on every retry, honours Retry-After.\n\n")

	pr.printf("1. Double click. The user taps Pay twice at once; both taps carry the key the app\n")
	pr.printf("   created when it showed the Pay button. One charge, one answer for both.\n")
	k1 := idemclient.NewKey()
	var wg sync.WaitGroup
	var taps [2]Result
	for i := range taps {
		wg.Go(func() { taps[i] = pay(fmt.Sprintf("tap %d", i+1), k1, 1000) })
	}
	wg.Wait()
	for i, t := range taps {
		pr.printf("   tap %d gets %s\n", i+1, t)
	}
	if taps[0].ID == "" || taps[0].ID != taps[1].ID {
		return fmt.Errorf("double click: two different answers: %s, %s", taps[0], taps[1])
	}
	if err := charges(1); err != nil {
		return err
	}

	pr.printf("2. Lost answer. The server charges and answers, but the phone changes networks\n")
	pr.printf("   and the answer is lost. The app retries with the same key: the stored answer.\n")
	d.LoseNextAnswer()
	r2 := pay("pay", idemclient.NewKey(), 2500)
	pr.printf("   the app gets %s\n", r2)
	if !r2.Replayed {
		return fmt.Errorf("lost answer: want the stored answer, got %s", r2)
	}
	if err := charges(2); err != nil {
		return err
	}

	pr.printf("3. Changed cart. The user adds an item: a new intent, so a new key and a new charge.\n")
	k3 := idemclient.NewKey()
	r3 := pay("pay", k3, 3000)
	pr.printf("   the app gets %s\n", r3)
	if err := charges(3); err != nil {
		return err
	}

	pr.printf("4. Reused key. A client bug sends the last key again with another amount: refused.\n")
	r4 := pay("buggy", k3, 9900)
	pr.printf("   the app gets %s\n", r4)
	if r4.Status != http.StatusUnprocessableEntity {
		return fmt.Errorf("reused key: want 422, got %s", r4)
	}
	if err := charges(3); err != nil {
		return err
	}

	pr.printf("5. Replica killed mid-charge. The replica that takes the next payment dies after\n")
	pr.printf("   the provider charged and before it books the payment: nothing is booked. Once\n")
	pr.printf("   its lease runs out, the retry takes over as attempt 2 (Fence 2) and asks the\n")
	pr.printf("   provider about the operation's stable id.\n")
	d.killNext.Store(true)
	r5 := pay("pay", idemclient.NewKey(), 4200)
	pr.printf("   the app gets %s\n", r5)
	if r5.Status != http.StatusCreated {
		return fmt.Errorf("killed replica: want 201, got %s", r5)
	}
	if err := charges(4); err != nil {
		return err
	}

	pr.printf("6. Read it back: GET /payments/%s\n", r5.ID)
	live := replicas[0]
	for _, r := range replicas {
		if !r.store.dead.Load() {
			live = r
		}
	}
	got, err := fetch(live.url+"/payments/"+r5.ID, "sk_test_alice")
	if err != nil {
		return err
	}
	pr.printf("   %s\n\n", got)
	for i, s := range more {
		if err := s(d, 7+i); err != nil {
			return err
		}
	}
	n := provider.Charges()
	pr.printf("%d intents, %d charges, %d ledger entries: every duplicate was harmless.\n", n, n, n)
	return nil
}

// Demo is what the scenarios share.
type Demo struct {
	pr         *printer
	client     *http.Client
	lb         *balancer
	replicas   []*Replica
	provider   *Provider
	ledger     Ledger
	killNext   atomic.Bool                  // the next charge's replica dies before its booking
	forgetNext atomic.Bool                  // Redis forgets the next lost answer's operation
	lastCommit atomic.Pointer[idem.Attempt] // the attempt that booked last
}

// hooks lets the scenarios kill a replica and make Redis forget.
func (d *Demo) hooks() {
	for _, r := range d.replicas {
		r.api.AfterCharge = func(ctx context.Context) {
			if !d.killNext.CompareAndSwap(true, false) {
				return
			}
			d.pr.note("%s dies (kill -9) right after the charge, before it books the payment", r.name)
			r.store.dead.Store(true) // no more heartbeats, no complete
			r.srv.Close()            // its connections drop
			<-ctx.Done()             // frozen until its lease is lost; it books nothing
		}
		r.api.AfterCommit = func(at *idem.Attempt) { d.lastCommit.Store(at) }
	}
	d.lb.afterDrop = func() {
		if !d.forgetNext.CompareAndSwap(true, false) {
			return
		}
		at := d.lastCommit.Load()
		r := d.replicas[0]
		record, lease := r.store.Store.(*idem.RedisStore).Keys(at.ID)
		if err := r.rdb.Del(context.Background(), record, lease).Err(); err != nil {
			d.pr.note("forgetting failed: %v", err)
			return
		}
		d.pr.note("Redis loses the record of the operation: a failover before replication")
	}
}

// Printf prints to the demo's output.
func (d *Demo) Printf(format string, args ...any) { d.pr.printf(format, args...) }

// LoseNextAnswer makes the load balancer lose the next answer, after the
// server processed the request.
func (d *Demo) LoseNextAnswer() { d.lb.dropAnswer.Store(true) }

// ForgetNextLostAnswer makes Redis lose the record of the operation whose
// answer is lost next, as a failover before replication would.
func (d *Demo) ForgetNextLostAnswer() { d.forgetNext.Store(true) }

// Pay makes one logical payment call through the load balancer.
func (d *Demo) Pay(label, key string, amount int64) Result {
	return payOnce(d.client, d.replicas[0].url, label, key, amount)
}

// Tally prints the provider's charges and the ledger's entries, and checks
// that each is want.
func (d *Demo) Tally(want int) error {
	got := d.provider.Charges()
	booked, err := d.ledger.Entries(context.Background())
	if err != nil {
		return err
	}
	d.pr.printf("   provider charges so far: %d; ledger entries: %d\n\n", got, booked)
	if got != want || booked != want {
		return fmt.Errorf("the provider made %d charges and the ledger holds %d entries, want %d", got, booked, want)
	}
	return nil
}

// Result is what the app learns from one payment call.
type Result struct {
	Status   int
	ID       string
	Replayed bool
	problem  string
	err      error
}

func (r Result) String() string {
	switch {
	case r.err != nil:
		return "error: " + r.err.Error()
	case r.problem != "":
		return fmt.Sprintf("%d %s", r.Status, r.problem)
	case r.Replayed:
		return fmt.Sprintf("%d, payment %s (the stored answer, Idempotent-Replayed: true)", r.Status, r.ID)
	}
	return fmt.Sprintf("%d, payment %s", r.Status, r.ID)
}

type labelKey struct{}

// payOnce makes one logical payment call with key.
func payOnce(client *http.Client, base, label, key string, amount int64) Result {
	ctx := context.WithValue(idemclient.WithKey(context.Background(), key), labelKey{}, label)
	body, _ := json.Marshal(paymentRequest{Amount: amount, Currency: "EUR"})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/payments", bytes.NewReader(body))
	if err != nil {
		return Result{err: err}
	}
	req.Header.Set("Authorization", "Bearer sk_test_alice")
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return Result{err: err}
	}
	defer resp.Body.Close()
	r := Result{Status: resp.StatusCode, Replayed: resp.Header.Get(idem.ReplayedHeader) == "true"}
	if resp.StatusCode >= 300 {
		var p struct{ Title, Detail string }
		_ = json.NewDecoder(resp.Body).Decode(&p)
		r.problem = p.Title + ": " + p.Detail
		return r
	}
	var p payment
	r.err = json.NewDecoder(resp.Body).Decode(&p)
	r.ID = p.ID
	return r
}

func fetch(u, apiKey string) (string, error) {
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.Status + " " + strings.TrimSpace(string(b)), err
}

// balancer is the load balancer in front of the replicas: each attempt goes
// to the next live replica. It prints every attempt, and can lose an answer.
type balancer struct {
	replicas   []*Replica
	next       atomic.Int64
	pr         *printer
	dropAnswer atomic.Bool // lose the next answer, after the server processed it
	transport  http.Transport
	afterDrop  func() // runs after an answer is lost
}

func (b *balancer) RoundTrip(req *http.Request) (*http.Response, error) {
	var r *Replica
	for range len(b.replicas) {
		r = b.replicas[int(b.next.Add(1))%len(b.replicas)]
		if !r.store.dead.Load() {
			break
		}
	}
	target, _ := url.Parse(r.url)
	out := req.Clone(req.Context())
	out.URL.Scheme, out.URL.Host, out.Host = target.Scheme, target.Host, ""
	label, _ := req.Context().Value(labelKey{}).(string)
	key := req.Header.Get(idem.DefaultKeyHeader)
	if len(key) > 10 {
		key = key[:9] + `…"`
	}
	resp, err := b.transport.RoundTrip(out)
	line := fmt.Sprintf("   %-6s %s %s key %s → %s:", label, req.Method, req.URL.Path, key, r.name)
	switch {
	case err != nil:
		b.pr.printf("%s no answer (%v)\n", line, shortErr(err))
	case b.dropAnswer.CompareAndSwap(true, false):
		resp.Body.Close()
		b.pr.printf("%s %s, but the answer is lost on the way\n", line, resp.Status)
		if b.afterDrop != nil {
			b.afterDrop()
		}
		return nil, errors.New("connection reset by peer")
	default:
		s := resp.Status
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			s += ", Retry-After: " + ra
		}
		if resp.Header.Get(idem.ReplayedHeader) != "" {
			s += ", Idempotent-Replayed: true"
		}
		b.pr.printf("%s %s\n", line, s)
	}
	return resp, err
}

func shortErr(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		s = s[i+2:]
	}
	return s
}

// printer serialises the demo's output.
type printer struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *printer) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format, args...)
}

// note prints a replica's remark.
func (p *printer) note(format string, args ...any) { p.printf("     ("+format+")\n", args...) }
