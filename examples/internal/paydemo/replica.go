package paydemo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idemstore"
)

// RedisOptions returns how to reach Redis: the given address or URL, or an
// embedded miniredis started here, which stop stops.
func RedisOptions(s string) (*redis.Options, func(), error) {
	switch {
	case s == "":
		m := miniredis.NewMiniRedis()
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			return nil, nil, err
		}
		return &redis.Options{Addr: m.Addr()}, followWallClock(m), nil
	case strings.Contains(s, "://"):
		o, err := redis.ParseURL(s)
		return o, func() {}, err
	}
	return &redis.Options{Addr: s}, func() {}, nil
}

// followWallClock makes miniredis expire keys as time passes, as Redis does
// (by itself it expires them only when told to fast-forward), and returns a
// function that stops it and the server.
func followWallClock(m *miniredis.Miniredis) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-quit:
				return
			case now := <-t.C:
				m.FastForward(now.Sub(last))
				last = now
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(quit)
			<-done
			m.Close()
		})
	}
}

// Replica is one instance of the API, with its own Redis connections, as a
// separate process would have.
type Replica struct {
	name  string
	url   string
	api   *API
	srv   *http.Server
	rdb   *redis.Client
	store *killableStore
}

// StartReplica starts a replica listening on addr. log receives idem's
// logs; logf the replica's remarks.
func StartReplica(name, addr string, opts *redis.Options, ledger Ledger, p *Provider, lease time.Duration, log *slog.Logger, logf func(string, ...any)) (*Replica, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	rdb := redis.NewClient(opts)
	store := &killableStore{Store: idem.NewRedisStore(rdb, idem.WithPrefix("payments"))}
	g := idem.New(store, idem.WithLease(lease), idem.WithLogger(log))
	r := &Replica{name: name, url: "http://" + ln.Addr().String(), rdb: rdb, store: store,
		api: &API{Name: name, Provider: p, Ledger: ledger, Logf: logf}}
	r.srv = &http.Server{Handler: r.api.Handler(g), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

// URL returns the replica's base URL.
func (r *Replica) URL() string { return r.url }

// Close stops the replica.
func (r *Replica) Close() {
	r.srv.Close()
	r.rdb.Close()
}

// Serve runs n replicas of the payments API on consecutive ports from addr,
// sharing one Redis and ledger, until the process is interrupted.
func Serve(addr string, n int, opts *redis.Options, ledger Ledger, lease time.Duration) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	first, err := strconv.Atoi(port)
	if err != nil {
		return fmt.Errorf("-addr needs a numeric port: %w", err)
	}
	provider := NewProvider(100 * time.Millisecond)
	logf := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	for i := range max(n, 1) {
		a := net.JoinHostPort(host, strconv.Itoa(first+i))
		r, err := StartReplica(fmt.Sprintf("replica %d", i+1), a, opts, ledger, provider, lease, slog.Default(), logf)
		if err != nil {
			return err
		}
		defer r.Close()
		fmt.Printf("payments API, %s: %s\n", r.name, r.url)
	}
	fmt.Printf("Redis at %s; ledger: %s; idempotency lease %v\n\nTry (run it twice):\n", opts.Addr, ledger, lease)
	fmt.Printf("  curl -i http://%s/payments -H 'Authorization: Bearer sk_test_alice' \\\n"+
		"    -H 'Idempotency-Key: %s' -H 'Content-Type: application/json' \\\n"+
		"    -d '{\"amount\": 1000, \"currency\": \"EUR\"}'\n", net.JoinHostPort(host, port), idemclient.NewKey())
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	<-ctx.Done()
	return nil
}

// killableStore lets the demo kill a replica: once dead, the replica
// reaches Redis no more, as a crashed process would not: no heartbeat, no
// complete, no release.
type killableStore struct {
	idemstore.Store
	dead atomic.Bool
}

var errDead = errors.New("replica is dead")

func (s *killableStore) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	if s.dead.Load() {
		return idemstore.ClaimResult{}, errDead
	}
	return s.Store.Claim(ctx, id, c)
}

func (s *killableStore) Heartbeat(ctx context.Context, id, owner string, lease time.Duration) error {
	if s.dead.Load() {
		return errDead
	}
	return s.Store.Heartbeat(ctx, id, owner, lease)
}

func (s *killableStore) Checkpoint(ctx context.Context, id, owner, name string, value []byte) error {
	if s.dead.Load() {
		return errDead
	}
	return s.Store.Checkpoint(ctx, id, owner, name, value)
}

func (s *killableStore) Complete(ctx context.Context, id, owner string, payload []byte, retention time.Duration) error {
	if s.dead.Load() {
		return errDead
	}
	return s.Store.Complete(ctx, id, owner, payload, retention)
}

func (s *killableStore) Release(ctx context.Context, id, owner string) error {
	if s.dead.Load() {
		return errDead
	}
	return s.Store.Release(ctx, id, owner)
}

// Discard is a logger that drops everything.
var Discard = slog.New(slog.NewTextHandler(io.Discard, nil))
