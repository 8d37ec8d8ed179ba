package verify

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
)

// A Workload is randomised traffic through Do, the HTTP middleware or Once
// (Via) as real clients make it: new keys, repeats of keys at random later
// times (retries after a timeout, an error or a lost answer), bursts of
// concurrent duplicates (double clicks), now and then a key reused with
// another request. Its function acts on a fenced Sink and reconciles when
// Attempt.Fence > 1, as the documentation asks of a function with an
// external side effect. Once gives its function no Attempt: there the
// function reconciles by the id on every run, as a consumer whose effect is
// idempotent by message id, and offers its effect with fence 0, so that for
// Once ids the Sink refuses nothing and I1 catches runs that act
// concurrently.
type Workload struct {
	Guards    []*idem.Guard // each call goes through one at random, as through one of several replicas
	Workers   int           // concurrent clients; default 16
	Keys      int           // distinct keys at most; default 1000
	KeyPrefix string        // keys are KeyPrefix followed by a number
	Payload   int           // bytes of each result; default 64
	Rate      int           // calls Run starts per second at most, bursts of duplicates included; 0: no bound
	Work      time.Duration // the function works a random time up to Work; default 2ms
	Timeout   time.Duration // bound of each call; 0: none
	Seed      uint64        // seed of the random choices
	Via       Via           // the entry point of the calls; default ViaDo

	// OnRun, when set, is called by the function as it starts, before its
	// effect, for fault injection (freeze the holder, end its lease). a is
	// nil under Once, whose operation id is
	// idem.OperationID(idem.KindOnce, "", key).
	OnRun func(ctx context.Context, key string, a *idem.Attempt)

	next    atomic.Int64 // keys used so far
	retries chan string  // keys to call again soon
	once    sync.Once
	pacer   pacer // Rate, over all workers
	calls   atomic.Int64
	web     webs // the HTTP servers of ViaHTTP, one per Guard
}

// errTransient is the failure the function returns now and then: the
// claim is released and a retry runs again.
var errTransient = errors.New("verify: transient failure")

// errFenced is what the function returns when the sink refused its effect.
var errFenced = errors.New("verify: effect refused: stale fence")

// Retry asks for key to be called again soon, as a client retries after an
// error or a timeout. It never blocks: when many retries are pending, the
// key is left to the random repeats.
func (w *Workload) Retry(key string) {
	w.defaults()
	select {
	case w.retries <- key:
	default:
	}
}

// Calls returns the number of calls made so far.
func (w *Workload) Calls() int64 { return w.calls.Load() }

// KeysUsed returns the number of distinct keys used so far.
func (w *Workload) KeysUsed() int { return int(min(w.next.Load(), int64(w.Keys))) }

func (w *Workload) defaults() {
	w.once.Do(func() { w.retries = make(chan string, 256) })
	if w.Workers <= 0 {
		w.Workers = 16
	}
	if w.Keys <= 0 {
		w.Keys = 1000
	}
	if w.Payload <= 0 {
		w.Payload = 64
	}
	if w.Work <= 0 {
		w.Work = 2 * time.Millisecond
	}
}

// Run makes calls until ctx ends, recording them in h and their effects in
// s, and returns once every call it started has returned.
func (w *Workload) Run(ctx context.Context, h *History, s *Sink) {
	w.defaults()
	var wg sync.WaitGroup
	for i := range w.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(w.Seed, uint64(i)))
			for ctx.Err() == nil {
				w.step(ctx, rnd, h, s)
			}
		}()
	}
	wg.Wait()
	w.web.close()
}

// step makes one client action: a call, or a burst of concurrent duplicates.
func (w *Workload) step(ctx context.Context, rnd *rand.Rand, h *History, s *Sink) {
	n := 1
	if rnd.IntN(8) == 0 {
		n = 2 + rnd.IntN(2)
	}
	if !w.pace(ctx, n) {
		return
	}
	key, req := w.pick(rnd)
	var wg sync.WaitGroup
	for range n - 1 {
		g, seed := w.Guards[rnd.IntN(len(w.Guards))], rnd.Uint64()
		wg.Go(func() { w.call(ctx, g, h, s, key, req, seed, false) })
	}
	w.call(ctx, w.Guards[rnd.IntN(len(w.Guards))], h, s, key, req, rnd.Uint64(), false)
	wg.Wait()
}

// pace waits until n calls may start under Rate; false when ctx ended.
func (w *Workload) pace(ctx context.Context, n int) bool {
	if w.Rate <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(time.Until(w.pacer.reserve(time.Now(), w.Rate, n)))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return false
	}
	return ctx.Err() == nil
}

// pick returns the key of the next action and its request: a key to
// retry, or a new key half the time while keys remain, otherwise a key used
// before, picked at random; one in 50 repeats carries another request.
func (w *Workload) pick(rnd *rand.Rand) (key, req string) {
	select {
	case key := <-w.retries:
		return key, "pay"
	default:
	}
	used := int64(w.KeysUsed()) // clients racing for the last new key count past Keys
	var n int64
	if used == 0 || (used < int64(w.Keys) && rnd.IntN(2) == 0) {
		n = w.next.Add(1) - 1
		if n >= int64(w.Keys) {
			n = rnd.Int64N(int64(w.Keys))
		}
	} else {
		n = rnd.Int64N(used)
	}
	key = w.KeyPrefix + strconv.FormatInt(n, 10)
	req = "pay"
	if rnd.IntN(50) == 0 {
		req = "other"
	}
	return key, req
}

// request is what a call fingerprints.
type request struct {
	Key    string `json:"key"`
	Action string `json:"action"`
}

// call makes one call through the key's entry point and records it.
func (w *Workload) call(ctx context.Context, g *idem.Guard, h *History, s *Sink, key, req string, seed uint64, probe bool) {
	w.calls.Add(1)
	if w.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, w.Timeout)
		defer cancel()
	}
	via := w.viaOf(key)
	op := h.begin(key, req, probe, via.String())
	rnd := rand.New(rand.NewPCG(seed, 1))
	var failed bool
	switch via {
	case ViaHTTP:
		failed = w.callHTTP(ctx, g, op, rnd, s, key, req)
	case ViaOnce:
		_, err := g.Once(ctx, key, func(ctx context.Context) error {
			_, err := w.fn(ctx, rnd, op, s, key, nil)
			return err
		})
		op.End("", err)
		failed = err != nil
	default:
		v, err := idem.Do(ctx, g, key, request{Key: key, Action: req}, func(ctx context.Context, a *idem.Attempt) (string, error) {
			return w.fn(ctx, rnd, op, s, key, a)
		})
		if err == nil {
			v = w.unpad(v)
		}
		op.End(v, err)
		failed = err != nil
	}
	if failed && !probe && req == "pay" && rnd.IntN(2) == 0 {
		w.Retry(key) // a client retrying after an error
	}
}

// viaOf returns the entry point of key: Via, or with ViaAll one of the three
// by the key's number, so that every call of a key goes the same way.
func (w *Workload) viaOf(key string) Via {
	if w.Via != ViaAll {
		return w.Via
	}
	n, _ := strconv.Atoi(strings.TrimPrefix(key, w.KeyPrefix))
	return Via(n % 3)
}

// fn is the operation's function: reconcile on a takeover, fail now and
// then, else act on the sink once and return the effect's value. a is nil
// under Once, which gives no Attempt: fn then reconciles on every run.
func (w *Workload) fn(ctx context.Context, rnd *rand.Rand, op *Op, s *Sink, key string, a *idem.Attempt) (string, error) {
	var fence int64
	if a != nil {
		fence = a.Fence
	}
	op.Ran(fence)
	if w.OnRun != nil {
		w.OnRun(ctx, key, a)
	}
	// The function's own work, which ignores ctx as a side effect under
	// way would.
	time.Sleep(time.Duration(rnd.Int64N(int64(w.Work) + 1)))
	if a == nil || fence > 1 {
		if v, ok := s.Lookup(key, fence); ok {
			return w.pad(v), nil
		}
	}
	switch rnd.IntN(20) {
	case 0:
		return "", errTransient
	case 1:
		return "", idem.Permanent(fmt.Errorf("verify: declined %s", key))
	}
	v := fmt.Sprintf("%s/%d/%d", key, fence, op.ID())
	if !s.Apply(op, key, fence, v) {
		return "", errFenced
	}
	return w.pad(v), nil
}

// pad makes the result Payload bytes long: the value, '|', then filler
// derived from the value that does not compress (a store that compresses
// results must hold every byte of it, as of a real result).
func (w *Workload) pad(v string) string {
	var b strings.Builder
	b.WriteString(v)
	b.WriteByte('|')
	sum := sha256.Sum256([]byte(v))
	for b.Len() < w.Payload {
		var x [2 * sha256.Size]byte
		hex.Encode(x[:], sum[:])
		b.Write(x[:min(len(x), w.Payload-b.Len())])
		sum = sha256.Sum256(sum[:])
	}
	return b.String()
}

// unpad returns the value in a result made by pad, or the result marked as
// corrupt when it is not one.
func (w *Workload) unpad(r string) string {
	v, _, ok := strings.Cut(r, "|")
	if !ok || r != w.pad(v) {
		return "corrupt:" + r[:min(len(r), 64)]
	}
	return v
}

// Probe calls every key used once more through g, as probes (I4), Workers
// at a time, not paced by Rate, and returns once all have returned. Give g a WithWait of at
// least lease + wait, so that a key is refused only if it stayed busy that
// long.
func (w *Workload) Probe(ctx context.Context, g *idem.Guard, h *History, s *Sink) {
	var keys []string
	for n := range min(w.next.Load(), int64(w.Keys)) {
		keys = append(keys, w.KeyPrefix+strconv.FormatInt(n, 10))
	}
	w.ProbeKeys(ctx, g, h, s, keys)
}

// ProbeKeys is Probe over the given keys, as History.Keys returns those
// that Workloads of other processes used.
func (w *Workload) ProbeKeys(ctx context.Context, g *idem.Guard, h *History, s *Sink, keys []string) {
	w.defaults()
	next := make(chan int)
	var wg sync.WaitGroup
	for i := range w.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range next {
				w.call(ctx, g, h, s, keys[n], "pay", w.Seed^uint64(n)^uint64(i), true)
			}
		}()
	}
	for n := range keys {
		next <- n
	}
	close(next)
	wg.Wait()
	w.web.close()
}
