package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/idemkit/idem"
)

// The sealed scenario: what WithSealer (AES-256-GCM, keyed fingerprints)
// costs against the same Guard without it, in the same run, interleaved:
// Do and the middleware, fresh keys and replays, 200 B and 10 KiB results,
// and the Redis bytes per completed record.

// sealedBodySizes are the result sizes compared.
var sealedBodySizes = []int{200, 10 << 10}

// sealedGoal is the throughput target at 200 B: sealed ≥ 0.9× plain.
const sealedGoal = 0.9

// sealedMemGoal is the memory target: a sealed record ≤ a plain one + 40 B.
const sealedMemGoal = 40

// benchSealer returns the Sealer of the scenario: one 32-byte key, id "k1",
// as short as a real deployment's should be.
func benchSealer() (idem.Sealer, error) {
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(rand.Uint32())
	}
	return idem.NewAESGCMSealer("k1", map[string][]byte{"k1": key})
}

// runSealed is the sealed scenario.
func runSealed(ctx context.Context, e *env) error {
	progress("scenario: sealed (WithSealer) vs plain")
	s, err := benchSealer()
	if err != nil {
		return err
	}
	clients := e.cfg.clients
	rc, _ := e.client(0, clients)
	var b strings.Builder
	b.WriteString("| workload | body | plain ops/s | sealed ops/s | sealed / plain | plain, per record | sealed, per record | sealed − plain |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, size := range sealedBodySizes {
		body := letters(size, rand.New(rand.NewPCG(uint64(size), 7)))
		sides := [2]*sealedSide{
			{name: "plain", prefix: "sp" + strconv.Itoa(size) + "-" + e.nonce, body: body},
			{name: "sealed", prefix: "ss" + strconv.Itoa(size) + "-" + e.nonce, body: body, opts: []idem.Option{idem.WithSealer(s)}},
		}
		for _, side := range sides {
			side.g = e.guard(rc, side.prefix, side.opts...)
			side.http = newHTTPTarget(e, side.g.Middleware(), body)
		}
		for _, w := range sealedWorkloads {
			plain, sealed := w.variant(e, sides[0], clients), w.variant(e, sides[1], clients)
			title := fmt.Sprintf("sealed, %s, %d B", w.name, size)
			if err := compare(ctx, scaled(e.cfg, sealedScale), title, plain, sealed); err != nil {
				return err
			}
			x := ratio(sealed, plain)
			fmt.Fprintf(&b, "| %s | %d B | %.0f | %.0f | **%.3f×** | | | |\n", w.name, size, plain.opsPerSec(), sealed.opsPerSec(), x)
			if size == 200 {
				e.rep.ratioTarget("sealed "+w.name+", 200 B: WithSealer vs plain", "sealed "+w.name, sealed, plain, sealedGoal)
			}
		}
		var per [2]memSize
		for i, side := range sides {
			if per[i], err = side.bytesPerRecord(ctx, e); err != nil {
				return err
			}
		}
		fmt.Fprintf(&b, "| memory, Do []byte result: value bytes | %d B | | | | %.0f | %.0f | **%+.0f B** |\n", size, per[0].stored, per[1].stored, per[1].stored-per[0].stored)
		fmt.Fprintf(&b, "| memory, Do []byte result: MEMORY USAGE | %d B | | | | %.0f | %.0f | **%+.0f B** |\n", size, per[0].usage, per[1].usage, per[1].usage-per[0].usage)
		if size == 200 {
			d := per[1].stored - per[0].stored
			e.rep.targets = append(e.rep.targets, target{name: "sealed record, 200 B: stored bytes, sealed − plain",
				got:  fmt.Sprintf("%+.0f B (MEMORY USAGE %+.0f B, allocator size classes)", d, per[1].usage-per[0].usage),
				want: fmt.Sprintf("≤ +%d B", sealedMemGoal), pass: d <= sealedMemGoal})
		}
	}
	sec := e.rep.section("Sealing: WithSealer vs plain",
		fmt.Sprintf("%d clients. The same Guard options and Redis, with and without `WithSealer(NewAESGCMSealer(\"k1\", …))`, "+
			"interleaved round by round. Do stores a []byte result of the body's size; the middleware answers 201 with the body "+
			"(served by httptest.Server on loopback). Bodies are random letters, which DEFLATE shrinks by about a quarter: a plain "+
			"record of 1 KiB or more is compressed by the store, a sealed one cannot be (ciphertext does not compress, and idem does "+
			"not compress before sealing, which would let the stored length tell about the content). Memory, over %d completed Do "+
			"records per side: the bytes of their values (STRLEN) and MEMORY USAGE, which rounds to the allocator's size classes.", clients, e.cfg.memRecords))
	sec.body = b.String()
	return nil
}

// sealedSide is one side of the comparison: a Guard with or without a
// Sealer, its middleware's server, and the keys it replays.
type sealedSide struct {
	name, prefix string
	body         []byte
	opts         []idem.Option
	g            *idem.Guard
	http         *httpTarget
	replayKeys   []string
}

// sealedWorkload builds the variant of one workload for one side.
type sealedWorkload struct {
	name    string
	variant func(e *env, s *sealedSide, clients int) *variant
}

var sealedWorkloads = []sealedWorkload{
	{"Do fresh", func(e *env, s *sealedSide, clients int) *variant {
		keys := keyer("f")
		return &variant{name: s.name + ", Do, fresh keys", clients: clients, srv: e.serverUsec,
			op: func(ctx context.Context, w int, seq uint64) error { return s.do(ctx, keys.key(w, seq), nil) }}
	}},
	{"Do replay", func(e *env, s *sealedSide, clients int) *variant {
		var ran atomic.Int64
		return &variant{name: s.name + ", Do, replays", clients: clients, srv: e.serverUsec,
			setup: func(ctx context.Context) error { return s.populate(ctx, e, "r", s.do) },
			op: func(ctx context.Context, w int, seq uint64) error {
				return s.do(ctx, s.replayKeys[(uint64(w)*7919+seq)%uint64(len(s.replayKeys))], &ran)
			}}
	}},
	{"middleware fresh", func(e *env, s *sealedSide, clients int) *variant {
		keys := keyer("hf")
		return &variant{name: s.name + ", g.Middleware, fresh keys", clients: clients, srv: e.serverUsec,
			op: func(ctx context.Context, w int, seq uint64) error { return s.post(ctx, keys.key(w, seq), nil) }}
	}},
	{"middleware replay", func(e *env, s *sealedSide, clients int) *variant {
		var ran atomic.Int64
		return &variant{name: s.name + ", g.Middleware, replays", clients: clients, srv: e.serverUsec,
			setup: func(ctx context.Context) error { return s.populate(ctx, e, "hr", s.post) },
			op: func(ctx context.Context, w int, seq uint64) error {
				return s.post(ctx, s.replayKeys[(uint64(w)*7919+seq)%uint64(len(s.replayKeys))], &ran)
			}}
	}},
}

// do runs one Do of key returning the body; with ran set, fn must not run
// (a replay).
func (s *sealedSide) do(ctx context.Context, key string, ran *atomic.Int64) error {
	got, err := idem.Do(ctx, s.g, key, theReq, func(context.Context, *idem.Attempt) ([]byte, error) {
		if ran != nil {
			ran.Add(1)
			return nil, fmt.Errorf("a replay of %s ran fn", key)
		}
		return s.body, nil
	})
	if err == nil && len(got) != len(s.body) {
		err = fmt.Errorf("result of %d bytes, want %d", len(got), len(s.body))
	}
	return err
}

// post sends one request with key through the side's middleware; with ran
// set (a replay), the handler must not have run since the keys were
// populated.
func (s *sealedSide) post(ctx context.Context, key string, ran *atomic.Int64) error {
	code, err := s.http.post(ctx, key)
	switch {
	case err != nil:
		return err
	case code != http.StatusCreated:
		return fmt.Errorf("status %d", code)
	case ran != nil && s.http.effects.Load() != int64(len(s.replayKeys)):
		return fmt.Errorf("a replay of %s ran the handler", key)
	}
	return nil
}

// populate completes the side's replay keys once.
func (s *sealedSide) populate(ctx context.Context, e *env, tag string, f func(context.Context, string, *atomic.Int64) error) error {
	s.replayKeys = make([]string, e.cfg.replayKeys)
	for i := range s.replayKeys {
		s.replayKeys[i] = tag + "-" + strconv.Itoa(i)
	}
	s.http.effects.Store(0)
	return populate(ctx, len(s.replayKeys), func(ctx context.Context, i int) error { return f(ctx, s.replayKeys[i], nil) })
}

// bytesPerRecord completes e.cfg.memRecords Do records under a fresh
// prefix with the side's options and returns their Redis bytes per record.
func (s *sealedSide) bytesPerRecord(ctx context.Context, e *env) (memSize, error) {
	c, _ := e.client(0, 16)
	// Four characters, as long as the default "idem"; one per side and size.
	prefix := fmt.Sprintf("m%c%02d", s.name[0], len(s.body)%97)
	g := e.guard(c, prefix, s.opts...)
	n := e.cfg.memRecords
	for i := range n {
		if _, err := idem.Do(ctx, g, "k"+strconv.Itoa(i), theReq, func(context.Context, *idem.Attempt) ([]byte, error) {
			return s.body, nil
		}); err != nil {
			return memSize{}, err
		}
	}
	used, _, _, err := e.usage(ctx, prefix+":*")
	if err != nil {
		return memSize{}, err
	}
	var stored int64
	iter := e.admin.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		l, err := e.admin.StrLen(ctx, iter.Val()).Result()
		if err != nil {
			return memSize{}, err
		}
		stored += l
	}
	return memSize{usage: float64(used) / float64(n), stored: float64(stored) / float64(n)}, iter.Err()
}

// memSize is the size of one completed record: MEMORY USAGE (with the
// allocator's rounding to its size classes) and the bytes of its value.
type memSize struct{ usage, stored float64 }

// sealedScale shortens the sealed scenario's rounds, to keep the whole run
// near five minutes: eight comparisons of two variants.
const sealedScale = 0.35
