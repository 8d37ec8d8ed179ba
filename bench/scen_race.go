package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/redis/go-redis/v9"
)

// raceSide counts what one approach did to a batch of contended keys.
type raceSide struct {
	name       string
	keys       int
	requests   int
	effects    int
	duplicates int // effects beyond the first, summed over keys
	dupKeys    int // keys with more than one effect
	busy       int // answered "in progress, retry later"
	replays    int
	errs       int
	firstErr   error
	elapsed    time.Duration
}

// contend runs one key: clients goroutines released together call op once.
// op returns whether it ran the effect, whether it was told busy, and an error.
func contend(ctx context.Context, clients int, op func(ctx context.Context) (ran, busy bool, err error), s *raceSide) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	var ran, busy, errs atomic.Int64
	var errMu sync.Mutex
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, b, err := op(ctx)
			switch {
			case err != nil:
				errs.Add(1)
				errMu.Lock()
				if s.firstErr == nil {
					s.firstErr = err
				}
				errMu.Unlock()
			case r:
				ran.Add(1)
			case b:
				busy.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	n := int(ran.Load())
	s.keys++
	s.requests += clients
	s.effects += n
	if n > 1 {
		s.duplicates += n - 1
		s.dupKeys++
	}
	s.busy += int(busy.Load())
	s.errs += int(errs.Load())
	s.replays += clients - n - int(busy.Load()) - int(errs.Load())
}

// runRace is scenario 4: a naive check-then-insert (GET, then SET) vs
// idem.Do, every key hit by all clients at once.
func runRace(ctx context.Context, e *env) error {
	clients, keys, rounds := e.cfg.clients, e.cfg.raceKeys, e.cfg.rounds
	progress("scenario 4: contention, %d clients × %d keys, effect %v", clients, keys, e.cfg.effect)
	c, _ := e.client(0, clients)
	g := e.guard(c, "r-"+e.nonce)
	naive := &raceSide{name: "naive GET, then SET"}
	guarded := &raceSide{name: "idem.Do"}
	perRound := max(keys/rounds, 1)
	k := 0
	for r := 0; r < rounds && k < keys; r++ {
		for range perRound {
			if k >= keys || ctx.Err() != nil {
				break
			}
			key := "c-" + e.nonce + "-" + strconv.Itoa(k)
			k++
			t := time.Now()
			contend(ctx, clients, func(ctx context.Context) (bool, bool, error) {
				err := c.Get(ctx, "naive:"+key).Err()
				if errors.Is(err, redis.Nil) {
					time.Sleep(e.cfg.effect) // the side effect
					return true, false, c.Set(ctx, "naive:"+key, rawPayload, retention).Err()
				}
				return false, false, err
			}, naive)
			naive.elapsed += time.Since(t)

			t = time.Now()
			contend(ctx, clients, func(ctx context.Context) (bool, bool, error) {
				ran := false
				_, err := idem.Do(ctx, g, key, theReq, func(ctx context.Context, a *idem.Attempt) (payment, error) {
					ran = true
					time.Sleep(e.cfg.effect) // the side effect
					return thePayment, nil
				})
				if errors.Is(err, idem.ErrInProgress) {
					return false, true, nil
				}
				return ran, false, err
			}, guarded)
			guarded.elapsed += time.Since(t)
		}
		progress("  contention: round %d/%d: naive %d duplicate effects, idem %d", r+1, rounds, naive.duplicates, guarded.duplicates)
	}
	e.rep.race(clients, e.cfg.effect, naive, guarded)
	e.rep.exactTarget("contention: duplicate side effects with idem", float64(guarded.duplicates), 0)
	if guarded.errs > 0 {
		return fmt.Errorf("contention: idem errors: %d (first: %v)", guarded.errs, guarded.firstErr)
	}
	return nil
}
