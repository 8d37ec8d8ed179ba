// Command webhooks is a webhook receiver protected by idem: senders deliver
// each event at least once and retry until they get a 2xx, and the
// receiver fulfils each event once.
//
//	go run ./examples/webhooks                       # play the scenarios and exit
//	go run ./examples/webhooks -addr 127.0.0.1:8081  # serve the receiver
//
// Without -redis or REDIS_URL it runs an embedded Redis (miniredis): nothing
// to install. Two senders are received: Stripe-style events on
// POST /webhooks/stripe, keyed by the event's id in the body and compared by
// type and data (pending_webhooks changes between deliveries), and Standard
// Webhooks (Svix and others) on POST /webhooks/standard, keyed by the
// webhook-id header. Each delivery's signature (HMAC-SHA256, as each scheme
// defines it) is checked before idem: a forged delivery gets 400 and never
// reaches Redis.
package main

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/paydemo"
)

// The demo's secrets; a real receiver reads them from its configuration.
const (
	stripeSecret   = "whsec_demo_stripe_endpoint_secret"
	standardSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
)

func main() {
	addr := flag.String("addr", "", "serve the receiver on this address instead of playing the scenarios")
	redisURL := flag.String("redis", "", "Redis address (host:port) or URL; default $REDIS_URL, else an embedded miniredis")
	flag.Parse()
	if *redisURL == "" {
		*redisURL = os.Getenv("REDIS_URL")
	}
	if err := run(os.Stdout, *addr, *redisURL); err != nil {
		fmt.Fprintln(os.Stderr, "webhooks:", err)
		os.Exit(1)
	}
}

func run(out io.Writer, addr, redisURL string) error {
	opts, stop, err := paydemo.RedisOptions(redisURL)
	if err != nil {
		return err
	}
	defer stop()
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	// A redelivery that arrives while the first is fulfilled waits for its
	// answer instead of getting 409 (which the sender would retry anyway).
	g := idem.New(idem.NewRedisStore(rdb), idem.WithWait(10*time.Second))
	v, err := newReceiver(stripeSecret, standardSecret)
	if err != nil {
		return err
	}
	if addr != "" {
		fmt.Fprintln(out, "receiving webhooks on http://"+addr+"/webhooks/stripe and /webhooks/standard")
		return http.ListenAndServe(addr, v.routes(g))
	}
	srv := httptest.NewServer(v.routes(g))
	defer srv.Close()
	return demo(out, srv.URL, v, rdb)
}

// demo plays the deliveries a receiver sees.
func demo(out io.Writer, url string, v *receiver, rdb *redis.Client) error {
	s := &sender{url: url, out: out}
	say := func(format string, args ...any) { fmt.Fprintf(out, "\n"+format+"\n", args...) }

	say("1. Stripe delivers evt_1 (an order paid, 2 endpoints pending):")
	s.stripe(stripeEvent("evt_1", 4200, 2), time.Now())
	say("2. Our answer was lost; Stripe delivers evt_1 again, pending_webhooks now 1, a new signature:")
	s.stripe(stripeEvent("evt_1", 4200, 1), time.Now().Add(time.Second))
	say("3. A delivery claiming to be evt_1 with another amount:")
	s.stripe(stripeEvent("evt_1", 9900, 1), time.Now())
	say("4. A forged delivery (wrong signature) is refused before Redis:")
	before, _ := rdb.DBSize(context.Background()).Result()
	s.send("/webhooks/stripe", stripeEvent("evt_2", 100, 1), map[string]string{"Stripe-Signature": "t=" + unix(time.Now()) + ",v1=00"})
	after, _ := rdb.DBSize(context.Background()).Result()
	fmt.Fprintf(out, "   Redis keys before and after: %d, %d\n", before, after)
	say("5. A Standard Webhooks sender delivers msg_1, then retries it with a new timestamp:")
	body := `{"type":"invoice.paid","timestamp":"2024-05-01T10:00:00Z","data":{"invoice":"in_7","amount":1500}}`
	s.standard("msg_1", body, time.Now())
	s.standard("msg_1", body, time.Now().Add(5*time.Second))
	say("6. 24 deliveries of evt_3 arrive at once (a sender's retry storm):")
	var wg sync.WaitGroup
	quiet := &sender{url: url, out: io.Discard}
	codes := make(chan int, 24)
	for i := range 24 {
		wg.Go(func() { codes <- quiet.stripe(stripeEvent("evt_3", 700, 24-i), time.Now()) })
	}
	wg.Wait()
	close(codes)
	ok := 0
	for c := range codes {
		if c == http.StatusOK {
			ok++
		}
	}
	fmt.Fprintf(out, "   %d of 24 answered 200\n", ok)

	events, total := v.effects()
	say("%d events received, %d fulfilments", events, total)
	if events != total {
		return fmt.Errorf("an event was fulfilled twice: %d events, %d fulfilments", events, total)
	}
	return nil
}

// stripeEvent is a Stripe-style event. pending_webhooks counts the
// endpoints still to be told: it changes from one delivery to the next.
func stripeEvent(id string, amount, pending int) string {
	return fmt.Sprintf(`{"id":%q,"object":"event","type":"checkout.session.completed","pending_webhooks":%d,"data":{"object":{"id":"cs_1","amount_total":%d,"currency":"eur"}}}`, id, pending, amount)
}

// sender signs and sends deliveries, and prints the answers.
type sender struct {
	url string
	out io.Writer
}

// stripe sends a Stripe-style delivery signed at t.
func (s *sender) stripe(body string, t time.Time) int {
	sig := hex.EncodeToString(sign([]byte(stripeSecret), unix(t)+".", []byte(body)))
	return s.send("/webhooks/stripe", body, map[string]string{"Stripe-Signature": "t=" + unix(t) + ",v1=" + sig})
}

// standard sends a Standard Webhooks delivery signed at t.
func (s *sender) standard(id, body string, t time.Time) int {
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(standardSecret, "whsec_"))
	sig := base64.StdEncoding.EncodeToString(sign(key, id+"."+unix(t)+".", []byte(body)))
	return s.send("/webhooks/standard", body, map[string]string{
		"webhook-id": id, "webhook-timestamp": unix(t), "webhook-signature": "v1," + sig,
	})
}

func (s *sender) send(path, body string, header map[string]string) int {
	r, err := http.NewRequest(http.MethodPost, s.url+path, strings.NewReader(body))
	if err != nil {
		fmt.Fprintln(s.out, "   ", err)
		return 0
	}
	r.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		r.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		fmt.Fprintln(s.out, "   ", err)
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var problem struct{ Title, Detail string }
	if resp.Header.Get("Content-Type") == "application/problem+json" && json.Unmarshal(b, &problem) == nil {
		b = []byte(problem.Title + ": " + problem.Detail)
	}
	replayed := ""
	if resp.Header.Get(idem.ReplayedHeader) == "true" {
		replayed = " (Idempotent-Replayed: true)"
	}
	fmt.Fprintf(s.out, "   %s%s %s\n", resp.Status, replayed, strings.TrimSpace(string(b)))
	return resp.StatusCode
}

func unix(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }
