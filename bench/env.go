package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/redis/go-redis/v9"
)

// retention is what the benchmark's records and raw keys live for: long
// enough for a run, short enough that a shared Redis given by -redis cleans
// itself up. The benchmark never runs FLUSHALL.
const retention = 10 * time.Minute

// env is what the scenarios share: server addresses, the admin client and
// everything to close at the end.
type env struct {
	cfg          *config
	redisAddr    string
	clusterAddrs []string
	clusterNote  string
	pgDSN        string
	pgNote       string
	admin        *redis.Client // no hooks: INFO, MEMORY USAGE, SCAN
	nonce        string        // keeps keys of this run apart from other runs
	closers      []func()
	rep          *report
}

func newNonce() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (e *env) onClose(f func()) { e.closers = append(e.closers, f) }

// emptyServers empties the standalone server and the cluster the benchmark
// started itself (FLUSHALL), so that no scenario runs on the keys the ones
// before it left: a server holding millions of keys costs every key
// operation more, and the figures would depend on which scenarios ran
// first. A server given by -redis or -cluster is left as it is.
func (e *env) emptyServers(ctx context.Context) error {
	if e.cfg.redisAddr == "" {
		if err := e.admin.FlushAll(ctx).Err(); err != nil {
			return fmt.Errorf("FLUSHALL %s: %w", e.redisAddr, err)
		}
	}
	if e.cfg.cluster != "" {
		return nil
	}
	for _, addr := range e.clusterAddrs {
		c := redis.NewClient(&redis.Options{Addr: addr})
		err := c.FlushAll(ctx).Err()
		c.Close()
		if err != nil {
			return fmt.Errorf("FLUSHALL %s: %w", addr, err)
		}
	}
	return nil
}

func (e *env) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
	e.closers = nil
}

// client returns a new go-redis client on the standalone server whose round
// trips are counted (and delayed by delay) by the returned hook. Like every
// client of the benchmarks, it is configured as idem's README recommends:
// ContextTimeoutEnabled, so that go-redis returns by a context's deadline.
func (e *env) client(delay time.Duration, poolSize int) (*redis.Client, *rtHook) {
	return e.clientWith(delay, poolSize, true)
}

// clientWith is client, with ContextTimeoutEnabled as given.
func (e *env) clientWith(delay time.Duration, poolSize int, ctxTimeout bool) (*redis.Client, *rtHook) {
	c := redis.NewClient(&redis.Options{
		Addr:                  e.redisAddr,
		PoolSize:              max(poolSize, 16),
		MinIdleConns:          0,
		ReadTimeout:           10 * time.Second,
		WriteTimeout:          10 * time.Second,
		ContextTimeoutEnabled: ctxTimeout,
	})
	h := newRTHook(delay)
	c.AddHook(h)
	e.onClose(func() { c.Close() })
	return c, &h
}

// clusterClient returns a cluster client whose logical commands are counted.
func (e *env) clusterClient(poolSize int) (*redis.ClusterClient, *rtHook) {
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 e.clusterAddrs,
		PoolSize:              max(poolSize, 16),
		ReadTimeout:           10 * time.Second,
		WriteTimeout:          10 * time.Second,
		ContextTimeoutEnabled: true,
	})
	h := newRTHook(0)
	c.AddHook(h)
	e.onClose(func() { c.Close() })
	return c, &h
}

// guard returns a Guard on c with its own key prefix.
func (e *env) guard(c redis.UniversalClient, prefix string, opts ...idem.Option) *idem.Guard {
	opts = append([]idem.Option{idem.WithRetention(retention)}, opts...)
	return idem.New(idem.NewRedisStore(c, idem.WithPrefix(prefix)), opts...)
}

// serverUsec returns the standalone server's CPU time so far (user + system,
// INFO cpu), in µs. Its delta per operation is the server's whole cost of an
// operation: parsing, the command or script, and the socket I/O.
// (INFO commandstats would count commands called from a script twice.)
func (e *env) serverUsec(ctx context.Context) (float64, error) {
	return serverCPU(ctx, e.admin)
}

func serverCPU(ctx context.Context, c *redis.Client) (float64, error) {
	m, err := c.InfoMap(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	for _, k := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(m["CPU"][k], 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu %s: %w", k, err)
		}
		total += v * 1e6
	}
	return total, nil
}

// keyer builds fresh keys: "<prefix>-<worker>-<seq>".
type keyer string

func (k keyer) key(w int, seq uint64) string {
	var b [64]byte
	s := append(b[:0], k...)
	s = append(s, '-')
	s = strconv.AppendInt(s, int64(w), 10)
	s = append(s, '-')
	s = strconv.AppendUint(s, seq, 10)
	return string(s)
}

// payment is the result every Do variant returns and stores (about 60 bytes
// of JSON); payReq is its request.
type payment struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
	Status string `json:"status"`
}

type payReq struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

var (
	thePayment = payment{ID: "pay_8f14e45fceea167a5a36dedd4bea2543", Amount: 1250, Status: "succeeded"}
	theReq     = payReq{Amount: 1250, Currency: "EUR"}
	// rawPayload is what the raw floor stores: thePayment as JSON.
	rawPayload = []byte(`{"id":"pay_8f14e45fceea167a5a36dedd4bea2543","amount":1250,"status":"succeeded"}`)
)

// populate runs f for i in [0,n) on up to 16 goroutines.
func populate(ctx context.Context, n int, f func(ctx context.Context, i int) error) error {
	var next atomic.Int64
	errc := make(chan error, 16)
	for range 16 {
		go func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					errc <- ctx.Err()
					return
				}
				if err := f(ctx, i); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	var errs []error
	for range 16 {
		errs = append(errs, <-errc)
	}
	return errors.Join(errs...)
}
