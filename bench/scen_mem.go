package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idem"
)

// memRow is the Redis memory of one kind of completed record.
type memRow struct {
	how           string
	body          int     // body bytes the caller stored
	bytesPerRec   float64 // MEMORY USAGE summed over the record's keys
	keysPerRecord float64
	baseline      float64 // a plain SET of the body under a key of the same length
}

func (m memRow) overhead() float64 { return m.bytesPerRec - float64(m.body) }

func letters(n int, r *rand.Rand) []byte {
	const abc = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = abc[r.IntN(len(abc))]
	}
	return b
}

// shortPrefix returns a random 4-letter key prefix, as long as idem's
// default "idem", so that key lengths are those of a real deployment.
func shortPrefix(r *rand.Rand) string {
	const abc = "abcdefghijklmnopqrstuvwxyz"
	b := []byte{'m', 0, 0, 0}
	for i := 1; i < len(b); i++ {
		b[i] = abc[r.IntN(len(abc))]
	}
	return string(b)
}

// usage sums MEMORY USAGE (SAMPLES 0: exact) over every key matching pattern.
// It also returns the length of the longest key (the record key).
func (e *env) usage(ctx context.Context, pattern string) (bytes int64, keys, keyLen int, err error) {
	iter := e.admin.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		n, err := e.admin.MemoryUsage(ctx, iter.Val(), 0).Result()
		if err != nil {
			return 0, 0, 0, err
		}
		bytes += n
		keys++
		keyLen = max(keyLen, len(iter.Val()))
	}
	return bytes, keys, keyLen, iter.Err()
}

// runMemory is scenario 6: Redis bytes per completed record.
func runMemory(ctx context.Context, e *env) error {
	progress("scenario 6: memory per completed record")
	n := e.cfg.memRecords
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2))
	c, _ := e.client(0, 16)
	for _, size := range []int{200, 10 << 10} {
		body := letters(size, r)
		first, keyLen := len(e.rep.mem), 0
		measure := func(how, prefix string, run func(i int) error) error {
			for i := range n {
				if err := run(i); err != nil {
					return fmt.Errorf("memory, %s: %w", how, err)
				}
			}
			b, k, kl, err := e.usage(ctx, prefix+":*")
			if err != nil {
				return err
			}
			keyLen = max(keyLen, kl)
			e.rep.mem = append(e.rep.mem, memRow{how: how, body: size, bytesPerRec: float64(b) / float64(n),
				keysPerRecord: float64(k) / float64(n)})
			return nil
		}

		// Text compresses (to about 3/4: 62 symbols); random bytes do not.
		random := make([]byte, size)
		for i := range random {
			random[i] = byte(r.UintN(256))
		}
		for _, content := range []struct {
			name string
			body []byte
		}{{"text", body}, {"random bytes", random}} {
			body := content.body
			p := shortPrefix(r)
			g := e.guard(c, p)
			if err := measure("idem.Do, []byte result, "+content.name, p, func(i int) error {
				_, err := idem.Do(ctx, g, "k"+strconv.Itoa(i), theReq, func(ctx context.Context, a *idem.Attempt) ([]byte, error) {
					return body, nil
				})
				return err
			}); err != nil {
				return err
			}
			if content.name == "text" {
				p = shortPrefix(r)
				g = e.guard(c, p)
				sbody := string(body)
				if err := measure("idem.Do, string result, text", p, func(i int) error {
					_, err := idem.Do(ctx, g, "k"+strconv.Itoa(i), theReq, func(ctx context.Context, a *idem.Attempt) (string, error) {
						return sbody, nil
					})
					return err
				}); err != nil {
					return err
				}
			}
			p = shortPrefix(r)
			g = e.guard(c, p)
			t := newHTTPTarget(e, middleware(g), body)
			if err := measure("g.Middleware (201, Content-Type), "+content.name, p, func(i int) error {
				code, err := t.post(ctx, "k"+strconv.Itoa(i))
				if err == nil && code != http.StatusCreated {
					err = fmt.Errorf("status %d", code)
				}
				return err
			}); err != nil {
				return err
			}
		}

		// Baseline: the body alone, under keys as long as idem's record keys.
		basePrefix := shortPrefix(r)
		idLen := max(keyLen-len(basePrefix)-3, 1)
		for i := range n {
			k := fmt.Sprintf("%s:{%0*d}", basePrefix, idLen, i)
			if err := c.Set(ctx, k, body, retention).Err(); err != nil {
				return err
			}
		}
		bb, bk, _, err := e.usage(ctx, basePrefix+":*")
		if err != nil {
			return err
		}
		for i := first; i < len(e.rep.mem); i++ {
			e.rep.mem[i].baseline = float64(bb) / float64(max(bk, 1))
		}
	}
	for _, m := range e.rep.mem {
		progress("  %-46s body %6d B: %8.0f B/record (%.1f keys), overhead %5.0f B; plain SET %6.0f B",
			m.how, m.body, m.bytesPerRec, m.keysPerRecord, m.overhead(), m.baseline)
		e.rep.memTarget(m)
	}
	return nil
}
