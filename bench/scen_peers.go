package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/idempotency"
	fiberredis "github.com/gofiber/storage/redis/v3"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// Scenario 7, "peers": idem against what a Go team would otherwise pick —
// the lock pattern with bsm/redislock or go-redsync (lock, GET, run, SET,
// unlock), the same with a GET before the lock (gofiber's order), and
// gofiber v2's idempotency middleware on its Redis storage with its default
// in-process lock or a Redis lock — measured interleaved in the same run.
// idem.Do runs twice: as is and with WithAutoPipeline (each on its own
// client, like every approach).

// lockTTL is how long the lock patterns hold their lock at most: idem's
// default lease.
const lockTTL = 30 * time.Second

// errLockBusy is what a lock pattern's lock reports when another caller
// holds it (and, when it waits, still held it after its retry budget).
var errLockBusy = errors.New("lock not obtained")

// locker takes the lock key and returns its release.
type locker func(ctx context.Context, key string) (unlock func(context.Context) error, err error)

// redislockLocker locks with bsm/redislock (a Lua SET NX PX; release is a
// compare-and-delete script); with wait it retries as lockRetry says, else
// it tries once.
func redislockLocker(c redis.UniversalClient, wait bool) locker {
	lc := redislock.New(c)
	return func(ctx context.Context, key string) (func(context.Context) error, error) {
		var opt *redislock.Options
		if wait {
			opt = redislockRetry()
		}
		l, err := lc.Obtain(ctx, key, lockTTL, opt)
		if errors.Is(err, redislock.ErrNotObtained) {
			err = errors.Join(errLockBusy, err)
		}
		if err != nil {
			return nil, err
		}
		return l.Release, nil
	}
}

// redsyncLocker locks with go-redsync on one Redis (SET NX PX; release is a
// compare-and-delete script).
func redsyncLocker(c redis.UniversalClient, opts ...redsync.Option) locker {
	rs := redsync.New(redsyncgoredis.NewPool(c))
	opts = append([]redsync.Option{redsync.WithExpiry(lockTTL)}, opts...)
	return func(ctx context.Context, key string) (func(context.Context) error, error) {
		m := rs.NewMutex(key, opts...)
		if err := m.LockContext(ctx); err != nil {
			var taken *redsync.ErrTaken
			if errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken) {
				err = errors.Join(errLockBusy, err)
			}
			return nil, err
		}
		return func(ctx context.Context) error { _, err := m.UnlockContext(ctx); return err }, nil
	}
}

// lockPattern is the design a Go team writes around a Redis lock library:
// lock the key, GET the stored result and return it if there is one, else
// run the function, SET its result (JSON) and unlock. With getFirst a GET
// before the lock answers a replay with one plain GET (gofiber's order).
type lockPattern struct {
	c        redis.UniversalClient
	prefix   string
	getFirst bool
	lock     locker
	fn       func() payment
}

func (p *lockPattern) do(ctx context.Context, key string) (res payment, err error) {
	k := p.prefix + ":{" + key + "}"
	if p.getFirst {
		if res, ok, err := getPayment(ctx, p.c, k); err != nil || ok {
			return res, err
		}
	}
	unlock, err := p.lock(ctx, k+":l")
	if err != nil {
		return payment{}, err
	}
	defer func() {
		if uerr := unlock(context.WithoutCancel(ctx)); err == nil {
			err = uerr
		}
	}()
	if res, ok, err := getPayment(ctx, p.c, k); err != nil || ok {
		return res, err
	}
	res = p.fn()
	b, err := json.Marshal(res)
	if err != nil {
		return payment{}, err
	}
	return res, p.c.Set(ctx, k, b, retention).Err()
}

func getPayment(ctx context.Context, c redis.UniversalClient, k string) (payment, bool, error) {
	b, err := c.Get(ctx, k).Bytes()
	if errors.Is(err, redis.Nil) {
		return payment{}, false, nil
	}
	if err != nil {
		return payment{}, false, err
	}
	var p payment
	return p, true, json.Unmarshal(b, &p)
}

// goPeer is one approach through its Go API: do runs the operation of key
// once, with the approach's own client, and the side effect counted in
// effects.
type goPeer struct {
	name    string
	do      func(ctx context.Context, key string) (payment, error)
	effects *atomic.Int64
}

// goPeerKinds are the approaches measured through their Go API; kind names
// index newGoPeer. idem's come first: idem.Do, then idem.Do with
// WithAutoPipeline (goPeerIdems of them).
var goPeerKinds = []string{"idem", "idempipe", "redislock", "redsync", "getfirst"}

// goPeerIdems is how many of goPeerKinds are idem's.
const goPeerIdems = 2

var goPeerTags = map[string]string{"idem": "i", "idempipe": "a", "redislock": "l", "redsync": "s", "getfirst": "g"}

var goPeerNames = map[string]string{
	"idem":      "idem.Do",
	"idempipe":  "idem.Do, WithAutoPipeline",
	"redislock": "bsm/redislock: lock, GET, run, SET, unlock",
	"redsync":   "go-redsync: lock, GET, run, SET, unlock",
	"getfirst":  "bsm/redislock, GET first: GET, lock, GET, run, SET, unlock",
}

// lockRetry is how a lock pattern that waits for a lock another caller
// holds retries: after a random 1–5 ms, at most 3000 times (about 10 s). The
// jitter matters: callers released together and retrying on a fixed period
// collide again on every retry, and only one gets through per period.
const (
	lockRetryMin = time.Millisecond
	lockRetryMax = 5 * time.Millisecond
	lockRetries  = 3000
)

func lockRetryDelay() time.Duration {
	return lockRetryMin + rand.N(lockRetryMax-lockRetryMin)
}

// jitterRetry is a redislock.RetryStrategy with lockRetry's delays; it
// counts its retries, so every Obtain needs its own.
type jitterRetry struct{ left int }

func (r *jitterRetry) NextBackoff() time.Duration {
	if r.left <= 0 {
		return 0
	}
	r.left--
	return lockRetryDelay()
}

func redislockRetry() *redislock.Options {
	return &redislock.Options{RetryStrategy: &jitterRetry{left: lockRetries}}
}

// newGoPeer builds approach kind on client c with key prefix prefix; effect
// (optional) is the side effect. With wait the lock patterns wait for a held
// lock (lockRetry), else they try it once and report errLockBusy.
func newGoPeer(e *env, kind string, c redis.UniversalClient, prefix string, effect func(), wait bool) *goPeer {
	p := &goPeer{name: goPeerNames[kind], effects: new(atomic.Int64)}
	effects := p.effects
	run := func() payment {
		if effect != nil {
			effect()
		}
		effects.Add(1)
		return thePayment
	}
	if kind == "idem" || kind == "idempipe" {
		g := e.guard(c, prefix)
		if kind == "idempipe" {
			g = pipeGuard(c, prefix)
		}
		fn := func(ctx context.Context, a *idem.Attempt) (payment, error) { return run(), nil }
		p.do = func(ctx context.Context, key string) (payment, error) { return idem.Do(ctx, g, key, theReq, fn) }
		return p
	}
	lp := &lockPattern{c: c, prefix: prefix, fn: run, getFirst: kind == "getfirst", lock: redislockLocker(c, wait)}
	if kind == "redsync" {
		tries := 1
		if wait {
			tries = lockRetries
		}
		lp.lock = redsyncLocker(c, redsync.WithTries(tries), redsync.WithRetryDelayFunc(func(int) time.Duration { return lockRetryDelay() }))
	}
	p.do = lp.do
	return p
}

// httpKey returns a 36-byte key (a UUID's length, which gofiber's
// idempotency middleware requires by default): tag (2 bytes), the run's
// nonce (8), worker and sequence.
func httpKey(tag, nonce string, w int, seq uint64) string {
	var b [48]byte
	s := append(b[:0], tag...)
	s = append(s, nonce...)
	s = append(s, '-')
	s = appendPadded(s, uint64(w), 4)
	s = append(s, '-')
	s = appendPadded(s, seq, 20)
	return string(s)
}

func appendPadded(s []byte, v uint64, width int) []byte {
	var d [20]byte
	n := strconv.AppendUint(d[:0], v, 10)
	for range width - len(n) {
		s = append(s, '0')
	}
	return append(s, n...)
}

// peerServer is one HTTP server of the HTTP comparison, on loopback TCP,
// called by a keep-alive net/http client.
type peerServer struct {
	url     string
	client  *http.Client
	effects atomic.Int64
	replays atomic.Int64 // answers with Idempotent-Replayed: true (idem only)
}

func newPeerClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 512, IdleConnTimeout: time.Minute},
		Timeout:   30 * time.Second,
	}
}

// newNetHTTPServer serves the bare net/http handler (wrap nil) or the
// handler behind wrap with httptest.Server. effect (optional) runs before
// the handler counts its side effect.
func newNetHTTPServer(e *env, wrap func(http.Handler) http.Handler, body []byte, effect func()) *peerServer {
	s := &peerServer{client: newPeerClient()}
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if effect != nil {
			effect()
		}
		s.effects.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	})
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	s.url = srv.URL + "/payments"
	e.onClose(func() { s.client.CloseIdleConnections(); srv.Close() })
	return s
}

// newFiberServer serves the same handler on gofiber v2 (fasthttp), bare
// (mw nil) or behind mw, on a loopback listener.
func newFiberServer(e *env, mw fiber.Handler, body []byte, effect func()) (*peerServer, error) {
	s := &peerServer{client: newPeerClient()}
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	if mw != nil {
		app.Use(mw)
	}
	app.Post("/payments", func(c *fiber.Ctx) error {
		_ = c.Body()
		if effect != nil {
			effect()
		}
		s.effects.Add(1)
		c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
		return c.Status(http.StatusCreated).Send(body)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() { _ = app.Listener(ln) }()
	s.url = "http://" + ln.Addr().String() + "/payments"
	e.onClose(func() { s.client.CloseIdleConnections(); _ = app.ShutdownWithTimeout(5 * time.Second) })
	return s, nil
}

// fiberIdempotency returns gofiber's idempotency middleware on its Redis
// storage over c; lock nil is its default in-process lock.
func fiberIdempotency(c redis.UniversalClient, lock idempotency.Locker) fiber.Handler {
	return idempotency.New(idempotency.Config{
		Lifetime:  retention,
		KeyHeader: "Idempotency-Key",
		Storage:   fiberredis.NewFromConnection(c),
		Lock:      lock,
	})
}

// fiberRedisLock is an idempotency.Locker on bsm/redislock: what a team
// writes to make gofiber's lock span instances. Lock blocks (retrying as
// lockRetry says) like the in-process lock it replaces.
type fiberRedisLock struct {
	c    *redislock.Client
	held sync.Map // key → *redislock.Lock
}

func newFiberRedisLock(c redis.UniversalClient) *fiberRedisLock {
	return &fiberRedisLock{c: redislock.New(c)}
}

func (l *fiberRedisLock) Lock(key string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lk, err := l.c.Obtain(ctx, "flk:{"+key+"}", lockTTL, redislockRetry())
	if err != nil {
		return err
	}
	l.held.Store(key, lk)
	return nil
}

func (l *fiberRedisLock) Unlock(key string) error {
	v, ok := l.held.LoadAndDelete(key)
	if !ok {
		return nil
	}
	return v.(*redislock.Lock).Release(context.Background())
}

// post sends one POST with key and drains the answer.
func (s *peerServer) post(ctx context.Context, key string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(httpReqBody))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Header.Get(idem.ReplayedHeader) == "true" {
		s.replays.Add(1)
	}
	return resp.StatusCode, nil
}

func (s *peerServer) want201(ctx context.Context, key string) error {
	code, err := s.post(ctx, key)
	if err == nil && code != http.StatusCreated {
		err = fmt.Errorf("status %d", code)
	}
	return err
}

// peersData is what the chart and the capacity summary take from scenario 7.
type peersData struct {
	goFresh, goReplay []*variant // goPeerKinds order; [0] is idem.Do, [1] with WithAutoPipeline
	httpPairs         [][2]*variant
}

// peerScale is the share of -duration each peers comparison measures per
// variant: it compares many variants, and the full run has a time budget.
const peerScale = 0.25

func scaled(c *config, f float64) *config {
	d := *c
	d.duration = max(time.Duration(float64(c.duration)*f), time.Duration(c.rounds)*10*time.Millisecond)
	return &d
}

// runPeers is scenario 7.
func runPeers(ctx context.Context, e *env) error {
	clients := e.cfg.clients
	cfg := scaled(e.cfg, peerScale)
	data := &peersData{}
	e.rep.peers = data

	// Go API, fresh keys and replays.
	progress("scenario 7: idem vs the alternatives, Go API, %d clients", clients)
	for _, replay := range []bool{false, true} {
		var vs []*variant
		for _, kind := range goPeerKinds {
			v, err := goPeerVariant(e, kind, clients, replay)
			if err != nil {
				return err
			}
			vs = append(vs, v)
		}
		what := "fresh keys"
		if replay {
			what = "replays"
		}
		if err := compare(ctx, cfg, "peers, Go API, "+what, vs...); err != nil {
			return err
		}
		if replay {
			data.goReplay = vs
		} else {
			data.goFresh = vs
		}
	}
	peerTargets(e, clients, data)

	// HTTP: each middleware against a bare handler on its own server.
	progress("scenario 7b: HTTP middlewares over their own bare handler, %d clients", clients)
	pairs, err := peerHTTPVariants(ctx, e, clients)
	if err != nil {
		return err
	}
	var hvs []*variant
	for i, p := range pairs {
		if i == 0 || p[0] != pairs[i-1][0] {
			hvs = append(hvs, p[0])
		}
		hvs = append(hvs, p[1])
	}
	if err := compare(ctx, cfg, "peers, HTTP", hvs...); err != nil {
		return err
	}
	data.httpPairs = pairs
	for i, limit := range []float64{35, 20} { // pairs[0] and [1]: net/http + g.Middleware, fresh keys and replays
		bare, mw := pairs[i][0], pairs[i][1]
		add := mw.allocsPerOp() - bare.allocsPerOp()
		what := [...]string{"fresh request", "replay"}[i]
		e.rep.maxTarget(fmt.Sprintf("HTTP: allocations g.Middleware adds per %s over a bare handler (§7b, whole process, %d clients)", what, clients),
			add, limit, fmt.Sprintf("%+.0f (%.0f vs %.0f)", add, mw.allocsPerOp(), bare.allocsPerOp()), fmt.Sprintf("≤ +%.0f", limit))
	}

	// Duplicated side effects across three instances.
	instances, per := 3, 16
	if e.cfg.quick {
		per = 4
	}
	progress("scenario 7c: duplicate side effects, %d instances × %d goroutines × %d keys, effect %v", instances, per, e.cfg.raceKeys, e.cfg.effect)
	sides, err := peerRace(ctx, e, instances, per)
	if err != nil {
		return err
	}

	progress("scenario 7d: Redis memory per record, %d records per approach", e.cfg.memRecords)
	mem, err := peerMemory(ctx, e)
	if err != nil {
		return err
	}

	e.rep.section("7. idem vs the alternatives: Go API", peersGoNote(e, clients, cfg)).body =
		"**Fresh keys** (every operation runs the function once and stores its ~80 B JSON result):\n\n" +
			peerTable(data.goFresh) + "\n**Replays** (every operation finds a stored result; each approach on its own " +
			strconv.Itoa(e.cfg.replayKeys) + " pre-completed keys):\n\n" + peerTable(data.goReplay)

	sec := e.rep.section("7b. HTTP middlewares: what each adds over its own bare handler", peersHTTPNote(clients, cfg))
	for _, p := range pairs {
		sec.pair(p[0], p[1])
	}
	sec.body = httpAddsTable(pairs)

	e.rep.section("7c. Duplicated side effects across instances", fmt.Sprintf(
		"%d instances (each its own go-redis client, lock, Guard or server; one Redis) × %d goroutines each hit every key at once "+
			"(%d keys, one after another, the approaches alternating key by key); the side effect takes %v (a sleep) and is counted per key. "+
			"The redislock and redsync patterns try their lock once, so a concurrent duplicate is told busy, as idem.Do and "+
			"g.Middleware without WithWait tell it at once (ErrInProgress, 409 + Retry-After); gofiber's Locker must block, so its Redis lock "+
			"retries after a random 1–5 ms until it holds the lock (a duplicate then reads the stored result: every waiter holds the lock in turn). "+
			"gofiber's default lock is a mutex inside one process: it serialises one instance's requests, not the instances'.",
		instances, per, e.cfg.raceKeys, e.cfg.effect)).body = peerRaceTable(sides)

	e.rep.section("7d. Redis memory per record, by approach", fmt.Sprintf(
		"`MEMORY USAGE <key> SAMPLES 0` summed over every key a completed operation leaves (the lock and lease keys are deleted "+
			"on completion), averaged over %d records each. Each approach names its keys its own way (idem: `<prefix>:{<hash of namespace, scope and key>}`; the lock "+
			"patterns here: `<prefix>:{<key>}`; gofiber: the raw 36-byte key), so the key length is given. The plain SET rows store the same "+
			"body under a key as long as idem's record key: Redis's own floor.", e.cfg.memRecords)).body = peerMemTable(mem)

	for _, s := range sides {
		if strings.HasPrefix(s.name, "idem") || strings.HasPrefix(s.name, "g.Middleware") {
			e.rep.exactTarget("peers, 3 instances × "+strconv.Itoa(per)+" goroutines: duplicate side effects with "+s.name, float64(s.duplicates), 0)
		}
	}
	return nil
}

func peersGoNote(e *env, clients int, cfg *config) string {
	return fmt.Sprintf("%d clients, each approach with its own go-redis client (RT/op counted by a hook: one per command or pipeline), "+
		"all on the standalone redis-server, interleaved in %d rounds of %v. Redis CPU µs/op is redis-server's user+system CPU "+
		"(`INFO cpu`) over the measured rounds divided by the operations. The lock patterns are what a team writes around a lock library: "+
		"lock `<k>:l` (redislock: a Lua `SET NX PX`; redsync: `SET NX PX`), `GET <k>`, and if absent run the function, `SET <k> <JSON> PX`, "+
		"unlock (a compare-and-delete script), retrying a held lock after a random 1–5 ms; the GET-first row adds a `GET` before the lock, as gofiber's middleware does, so that a "+
		"replay is one plain `GET`. All store and decode the same JSON result. idem.Do runs as is and with WithAutoPipeline "+
		"(its store batches the scripts of concurrent calls, §12). \"idem.Do ÷ this\" is idem.Do's throughput over the row's, and the next column the same with the option.",
		clients, cfg.rounds, cfg.duration/time.Duration(cfg.rounds))
}

func peersHTTPNote(clients int, cfg *config) string {
	return fmt.Sprintf("%d clients, one keep-alive net/http client per server, loopback TCP; the handler reads a 60 B JSON body, counts its "+
		"side effect and answers 201 with 200 B. net/http servers are `httptest.Server`; gofiber v2 runs on fasthttp, so each middleware "+
		"is compared with the bare handler on its own server, interleaved in the same rounds (%d rounds of %v). gofiber's idempotency "+
		"middleware uses its Redis storage (gofiber/storage/redis/v3 on the counted go-redis client) with its default lock (a mutex in "+
		"the process) or a Redis lock (an idempotency.Locker on bsm/redislock). Allocations and client CPU are the whole process's "+
		"(client and server).", clients, cfg.rounds, cfg.duration/time.Duration(cfg.rounds))
}

// goPeerVariant returns approach kind as a variant on fresh keys or on
// replays of its own pre-completed keys.
func goPeerVariant(e *env, kind string, clients int, replay bool) (*variant, error) {
	c, h := e.client(0, clients)
	tag := "f"
	if replay {
		tag = "r"
	}
	prefix := "p" + goPeerTags[kind] + tag + "-" + e.nonce
	p := newGoPeer(e, kind, c, prefix, nil, true)
	v := &variant{name: p.name, clients: clients, rt: h.n, srv: e.serverUsec}
	if !replay {
		keys := keyer("k")
		v.op = func(ctx context.Context, w int, seq uint64) error {
			_, err := p.do(ctx, keys.key(w, seq))
			return err
		}
		return v, nil
	}
	n := e.cfg.replayKeys
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "rk-" + strconv.Itoa(i)
	}
	var effects0 int64
	v.setup = func(ctx context.Context) error {
		err := populate(ctx, n, func(ctx context.Context, i int) error { _, err := p.do(ctx, keys[i]); return err })
		effects0 = p.effects.Load()
		return err
	}
	v.op = func(ctx context.Context, w int, seq uint64) error {
		r, err := p.do(ctx, keys[(uint64(w)*7919+seq)%uint64(n)])
		if err == nil && r.ID != thePayment.ID {
			err = fmt.Errorf("replay returned %+v", r)
		}
		if err == nil && p.effects.Load() != effects0 {
			err = errors.New("a replay ran the function again")
		}
		return err
	}
	return v, nil
}

// peerHTTPVariants returns (bare, middleware) pairs: net/http with
// g.Middleware, gofiber with its idempotency middleware and default lock,
// and with a Redis lock; fresh keys and replays for each.
func peerHTTPVariants(ctx context.Context, e *env, clients int) ([][2]*variant, error) {
	n := e.cfg.replayKeys
	bareKeys := func(s *peerServer) func(ctx context.Context, w int, seq uint64) error {
		return func(ctx context.Context, w int, seq uint64) error {
			return s.want201(ctx, httpKey("hb", e.nonce, w, seq))
		}
	}
	// Fresh keys and replays each get their own server and client, so that
	// a replay variant can check that its handler never runs.
	mwPair := func(name, tag string, mk func(c redis.UniversalClient) (*peerServer, error)) (fresh, replay *variant, err error) {
		fc, fh := e.client(0, clients)
		fs, err := mk(fc)
		if err != nil {
			return nil, nil, err
		}
		fresh = &variant{name: name + ", fresh keys", clients: clients, rt: fh.n, srv: e.serverUsec,
			op: func(ctx context.Context, w int, seq uint64) error {
				return fs.want201(ctx, httpKey(tag, e.nonce, w, seq))
			}}
		rc, rh := e.client(0, clients)
		rs, err := mk(rc)
		if err != nil {
			return nil, nil, err
		}
		var effects0 int64
		key := func(i uint64) string { return httpKey(tag, e.nonce, 9999, i) }
		replay = &variant{name: name + ", replays", clients: clients, rt: rh.n, srv: e.serverUsec,
			setup: func(ctx context.Context) error {
				err := populate(ctx, n, func(ctx context.Context, i int) error { return rs.want201(ctx, key(uint64(i))) })
				effects0 = rs.effects.Load()
				return err
			},
			op: func(ctx context.Context, w int, seq uint64) error {
				err := rs.want201(ctx, key((uint64(w)*7919+seq)%uint64(n)))
				if err == nil && rs.effects.Load() != effects0 {
					err = errors.New("a replay ran the handler")
				}
				return err
			}}
		return fresh, replay, nil
	}

	netBare := newNetHTTPServer(e, nil, httpRespBody, nil)
	bn := &variant{name: "net/http, bare handler", clients: clients, srv: e.serverUsec, op: bareKeys(netBare)}
	idemFresh, idemReplay, err := mwPair("net/http + idem g.Middleware", "hi", func(c redis.UniversalClient) (*peerServer, error) {
		return newNetHTTPServer(e, middleware(e.guard(c, "ph-"+e.nonce)), httpRespBody, nil), nil
	})
	if err != nil {
		return nil, err
	}
	fiberBare, err := newFiberServer(e, nil, httpRespBody, nil)
	if err != nil {
		return nil, err
	}
	bf := &variant{name: "gofiber, bare handler", clients: clients, srv: e.serverUsec, op: bareKeys(fiberBare)}
	memFresh, memReplay, err := mwPair("gofiber + idempotency (in-process lock)", "fm", func(c redis.UniversalClient) (*peerServer, error) {
		return newFiberServer(e, fiberIdempotency(c, nil), httpRespBody, nil)
	})
	if err != nil {
		return nil, err
	}
	rlFresh, rlReplay, err := mwPair("gofiber + idempotency (Redis lock)", "fr", func(c redis.UniversalClient) (*peerServer, error) {
		return newFiberServer(e, fiberIdempotency(c, newFiberRedisLock(c)), httpRespBody, nil)
	})
	if err != nil {
		return nil, err
	}
	return [][2]*variant{
		{bn, idemFresh}, {bn, idemReplay},
		{bf, memFresh}, {bf, memReplay}, {bf, rlFresh}, {bf, rlReplay},
	}, nil
}

// peerTable renders approaches (idem's first, goPeerIdems of them) with
// each idem variant's throughput over each row's.
func peerTable(vs []*variant) string {
	var b strings.Builder
	b.WriteString("| approach | ops/s (median) | idem.Do ÷ this | idem.Do, WithAutoPipeline ÷ this | p50 | p99 | RT/op | Redis CPU µs/op | allocs/op | client CPU µs/op | errors |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, v := range vs {
		var rel [goPeerIdems]string
		for j := range rel {
			rel[j] = "—"
			if i != j && j < len(vs) {
				rel[j] = fmt.Sprintf("**%.2f×**", ratio(vs[j], v))
			}
		}
		fmt.Fprintf(&b, "| %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %d |\n", v.name, v.opsPerSec(), rel[0], rel[1],
			fmtDur(v.lat.quantile(0.5)), fmtDur(v.lat.quantile(0.99)), fmtF(v.rtPerOp(), 2), fmtF(v.srvUsecPerOp(), 1),
			fmtF(v.allocsPerOp(), 0), fmtF(v.cliUsecPerOp(), 1), v.errs)
	}
	return b.String()
}

// peerTargets records the auto-pipelining issue's targets against the
// alternatives: with WithAutoPipeline, idem's replays at least as fast as
// the GET-first lock pattern's, and its fresh operations at least 1.5× every
// lock pattern's.
func peerTargets(e *env, clients int, d *peersData) {
	if len(d.goFresh) != len(goPeerKinds) || len(d.goReplay) != len(goPeerKinds) {
		return
	}
	for i, kind := range goPeerKinds {
		if kind == "getfirst" {
			e.rep.ratioTarget(fmt.Sprintf("peers, %d clients: idem.Do replays with WithAutoPipeline / the GET-first lock pattern's (§7)", clients),
				"peers replay vs GET first", d.goReplay[1], d.goReplay[i], 1.0)
		}
	}
	for i, kind := range goPeerKinds[goPeerIdems:] {
		v := d.goFresh[goPeerIdems+i]
		e.rep.ratioTarget(fmt.Sprintf("peers, %d clients: idem.Do fresh with WithAutoPipeline / %s (§7)", clients, v.name),
			"peers fresh vs "+kind, d.goFresh[1], v, 1.5)
	}
}

// httpAddsTable renders what each middleware adds to its own bare handler.
func httpAddsTable(pairs [][2]*variant) string {
	var b strings.Builder
	b.WriteString("What each middleware adds over the bare handler on the same server, measured in the same rounds:\n\n")
	b.WriteString("| middleware | throughput kept (× bare) | + p50 | + p99 | RT/op | Redis CPU µs/op | + allocs/op | + process CPU µs/op |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range pairs {
		bare, v := p[0], p[1]
		fmt.Fprintf(&b, "| %s | **%.2f×** | %s | %s | %s | %s | %+.0f | %+.1f |\n", v.name, ratio(v, bare),
			fmtDelta(v.lat.quantile(0.5)-bare.lat.quantile(0.5)), fmtDelta(v.lat.quantile(0.99)-bare.lat.quantile(0.99)),
			fmtF(v.rtPerOp(), 2), fmtF(v.srvUsecPerOp()-bare.srvUsecPerOp(), 1),
			v.allocsPerOp()-bare.allocsPerOp(), v.cliUsecPerOp()-bare.cliUsecPerOp())
	}
	return b.String()
}

func fmtDelta(d time.Duration) string {
	if d < 0 {
		return "−" + fmtDur(-d)
	}
	return "+" + fmtDur(d)
}

// raceRunner is one approach of the contention test: call sends one
// request for key through instance inst and reports whether it was told
// busy (in progress, or the lock not obtained in time).
type raceRunner struct {
	side    *raceSide
	effects func() int64
	call    func(ctx context.Context, inst int, key string) (busy bool, err error)
}

// peerRace runs every key through every approach in turn: instances ×
// per goroutines released at once, and counts side effects per key.
func peerRace(ctx context.Context, e *env, instances, per int) ([]*raceSide, error) {
	effect := func() { time.Sleep(e.cfg.effect) }
	var runners []*raceRunner

	goRunner := func(kind, prefix string) {
		peers := make([]*goPeer, instances)
		total := new(atomic.Int64)
		for i := range peers {
			c, _ := e.client(0, per)
			peers[i] = newGoPeer(e, kind, c, prefix, func() { effect(); total.Add(1) }, false)
		}
		runners = append(runners, &raceRunner{side: &raceSide{name: peers[0].name}, effects: total.Load,
			call: func(ctx context.Context, inst int, key string) (bool, error) {
				_, err := peers[inst].do(ctx, key)
				if errors.Is(err, idem.ErrInProgress) || errors.Is(err, errLockBusy) {
					return true, nil
				}
				return false, err
			}})
	}
	httpRunner := func(name string, mk func(i int, effect func()) (*peerServer, error)) error {
		srvs := make([]*peerServer, instances)
		total := new(atomic.Int64)
		for i := range srvs {
			s, err := mk(i, func() { effect(); total.Add(1) })
			if err != nil {
				return err
			}
			srvs[i] = s
		}
		runners = append(runners, &raceRunner{side: &raceSide{name: name}, effects: total.Load,
			call: func(ctx context.Context, inst int, key string) (bool, error) {
				code, err := srvs[inst].post(ctx, key)
				switch {
				case err != nil:
					return false, err
				case code == http.StatusConflict:
					return true, nil
				case code != http.StatusCreated:
					return false, fmt.Errorf("status %d", code)
				}
				return false, nil
			}})
		return nil
	}

	goRunner("idem", "pxi-"+e.nonce)
	if err := httpRunner("g.Middleware (net/http)", func(i int, effect func()) (*peerServer, error) {
		c, _ := e.client(0, per)
		return newNetHTTPServer(e, middleware(e.guard(c, "pxh-"+e.nonce)), httpRespBody, effect), nil
	}); err != nil {
		return nil, err
	}
	goRunner("redislock", "pxl-"+e.nonce)
	goRunner("redsync", "pxs-"+e.nonce)
	if err := httpRunner("gofiber idempotency, in-process lock (its default)", func(i int, effect func()) (*peerServer, error) {
		c, _ := e.client(0, per)
		return newFiberServer(e, fiberIdempotency(c, nil), httpRespBody, effect)
	}); err != nil {
		return nil, err
	}
	if err := httpRunner("gofiber idempotency, Redis lock (bsm/redislock)", func(i int, effect func()) (*peerServer, error) {
		c, _ := e.client(0, per)
		return newFiberServer(e, fiberIdempotency(c, newFiberRedisLock(c)), httpRespBody, effect)
	}); err != nil {
		return nil, err
	}

	tags := []string{"xa", "xb", "xc", "xd", "xe", "xf"}
	keys := e.cfg.raceKeys
	for k := range keys {
		for ri, r := range runners {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			key := httpKey(tags[ri], e.nonce, 0, uint64(k))
			t := time.Now()
			raceKey(ctx, r, key, instances, per)
			r.side.elapsed += time.Since(t)
		}
		if (k+1)%max(keys/4, 1) == 0 || k+1 == keys {
			var s []string
			for _, r := range runners {
				s = append(s, strconv.Itoa(r.side.duplicates))
			}
			progress("  duplicates: %d/%d keys: %s", k+1, keys, strings.Join(s, " "))
		}
	}
	var sides []*raceSide
	for _, r := range runners {
		sides = append(sides, r.side)
		if r.side.errs > 0 {
			progress("  %s: %d errors (first: %v)", r.side.name, r.side.errs, r.side.firstErr)
		}
	}
	return sides, nil
}

// raceKey releases instances × per goroutines at once on key and adds the
// outcome to r.side. Keys run one after another, so the side effects
// counted meanwhile are this key's.
func raceKey(ctx context.Context, r *raceRunner, key string, instances, per int) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	s := r.side
	before := r.effects()
	var wg sync.WaitGroup
	start := make(chan struct{})
	var busy, errs atomic.Int64
	var errMu sync.Mutex
	for inst := range instances {
		for range per {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				b, err := r.call(ctx, inst, key)
				switch {
				case err != nil:
					errs.Add(1)
					errMu.Lock()
					if s.firstErr == nil {
						s.firstErr = err
					}
					errMu.Unlock()
				case b:
					busy.Add(1)
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	n := int(r.effects() - before)
	reqs := instances * per
	s.keys++
	s.requests += reqs
	s.effects += n
	if n > 1 {
		s.duplicates += n - 1
		s.dupKeys++
	}
	s.busy += int(busy.Load())
	s.errs += int(errs.Load())
	s.replays += reqs - n - int(busy.Load()) - int(errs.Load())
}

func peerRaceTable(sides []*raceSide) string {
	var b strings.Builder
	b.WriteString("| approach | keys | requests | side effects | duplicate effects | keys with duplicates | told busy (409, ErrInProgress, lock not obtained) | answered with the stored result | errors | wall time |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range sides {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | **%d** | %d | %d | %d | %d | %s |\n", s.name, s.keys, s.requests, s.effects,
			s.duplicates, s.dupKeys, s.busy, s.replays, s.errs, fmtDur(s.elapsed))
	}
	return b.String()
}

// peerMemRow is the Redis memory of one approach's completed records.
type peerMemRow struct {
	how      string
	body     int
	bytes    float64 // per record, summed over its keys
	keys     float64 // keys per record
	keyLen   int     // the record key's length
	baseline bool
}

// peerMemory stores memRecords results through each approach and sums
// MEMORY USAGE over the keys they leave.
func peerMemory(ctx context.Context, e *env) ([]peerMemRow, error) {
	n := e.cfg.memRecords
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	c, _ := e.client(0, 16)
	var rows []peerMemRow
	measure := func(how string, body int, pattern string, run func(i int) error) error {
		for i := range n {
			if err := run(i); err != nil {
				return fmt.Errorf("memory, %s: %w", how, err)
			}
		}
		b, k, kl, err := e.usage(ctx, pattern)
		if err != nil {
			return err
		}
		rows = append(rows, peerMemRow{how: how, body: body, bytes: float64(b) / float64(n), keys: float64(k) / float64(n), keyLen: kl})
		return nil
	}
	idemKeyLen := 0
	for _, kind := range []string{"idem", "redislock", "redsync"} {
		p := shortPrefix(r)
		gp := newGoPeer(e, kind, c, p, nil, true)
		if err := measure(gp.name+", ~80 B JSON result", len(rawPayload), p+":*", func(i int) error {
			_, err := gp.do(ctx, "k"+strconv.Itoa(i))
			return err
		}); err != nil {
			return nil, err
		}
		if kind == "idem" {
			idemKeyLen = rows[len(rows)-1].keyLen
		}
	}
	p := shortPrefix(r)
	s := newNetHTTPServer(e, middleware(e.guard(c, p)), httpRespBody, nil)
	if err := measure("idem g.Middleware, 201 + Content-Type + 200 B body", len(httpRespBody), p+":*", func(i int) error {
		return s.want201(ctx, httpKey("mm", e.nonce, 0, uint64(i)))
	}); err != nil {
		return nil, err
	}
	f, err := newFiberServer(e, fiberIdempotency(c, nil), httpRespBody, nil)
	if err != nil {
		return nil, err
	}
	if err := measure("gofiber idempotency, 201 + headers + 200 B body", len(httpRespBody), "mf"+e.nonce+"-*", func(i int) error {
		return f.want201(ctx, httpKey("mf", e.nonce, 0, uint64(i)))
	}); err != nil {
		return nil, err
	}
	for _, body := range [][]byte{rawPayload, httpRespBody} {
		p := shortPrefix(r)
		idLen := max(idemKeyLen-len(p)-3, 1)
		if err := measure(fmt.Sprintf("plain SET of the %d B body (Redis's floor)", len(body)), len(body), p+":*", func(i int) error {
			return c.Set(ctx, fmt.Sprintf("%s:{%0*d}", p, idLen, i), body, retention).Err()
		}); err != nil {
			return nil, err
		}
		rows[len(rows)-1].baseline = true
	}
	for _, m := range rows {
		progress("  %-62s body %4d B: %6.0f B/record (%.1f keys, key %d B)", m.how, m.body, m.bytes, m.keys, m.keyLen)
	}
	return rows, nil
}

func peerMemTable(rows []peerMemRow) string {
	floor := map[int]float64{}
	for _, m := range rows {
		if m.baseline {
			floor[m.body] = m.bytes
		}
	}
	var b strings.Builder
	b.WriteString("| stored via | body | bytes per record | keys per record | record key length | over the body | over a plain SET of the body |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|\n")
	for _, m := range rows {
		over := "—"
		if f, ok := floor[m.body]; ok && !m.baseline {
			over = fmt.Sprintf("%+.0f B", m.bytes-f)
		}
		fmt.Fprintf(&b, "| %s | %d | %.0f | %.1f | %d | %+.0f B | %s |\n", m.how, m.body, m.bytes, m.keys, m.keyLen, m.bytes-float64(m.body), over)
	}
	return b.String()
}
