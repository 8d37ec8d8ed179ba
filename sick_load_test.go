//go:build unix

package idem_test

// A freeze under load, with the default store budget (1 s): 16 clients send
// fresh keys through Do while Redis is frozen for 4 s. Every answer comes
// within 1.5 s; once Redis answers again, every key refused meanwhile runs on
// its first retry sent 1.5 s later (never ErrInProgress), and no function
// runs twice for a key.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

const (
	loadClients = 16
	loadFreeze  = 4 * time.Second
	// loadBound is the longest answer allowed during the freeze with the
	// default budget: the budget and half a second of scheduling.
	loadBound = 1500 * time.Millisecond
	// loadRetryAfter is when the refused keys are retried, after Redis
	// answers again.
	loadRetryAfter = 1500 * time.Millisecond
	// loadPause is a client's pause after a refusal before its next key.
	loadPause = 20 * time.Millisecond
)

// loadCall is one request of the load and what it got.
type loadCall struct {
	key        string
	start, end time.Time
	err        error
}

// TestFreezeUnderLoad: see the top of the file. Keys whose function ran and
// whose completion was not stored in time (ErrNotRecorded) are replayed by
// their retry; the others run then, once.
func TestFreezeUnderLoad(t *testing.T) {
	for _, c := range sickClients {
		t.Run(c.name, func(t *testing.T) {
			s := startSick(t, "SIGSTOP")
			g := idem.New(idem.NewRedisStore(s.client(c.ctxTimeout)), quiet, idem.WithStoreTimeout(time.Second)) // the default budget
			ctx := context.Background()
			var runs sync.Map // key → *atomic.Int32
			fn := func(key string) func(context.Context, *idem.Attempt) (string, error) {
				return func(context.Context, *idem.Attempt) (string, error) {
					n, _ := runs.LoadOrStore(key, new(atomic.Int32))
					n.(*atomic.Int32).Add(1)
					return "v-" + key, nil
				}
			}

			var stop atomic.Bool
			frozen := make(chan struct{})
			calls := make([][]loadCall, loadClients)
			var wg sync.WaitGroup
			for w := range loadClients {
				wg.Go(func() {
					for i := 0; !stop.Load(); i++ {
						key := fmt.Sprintf("w%d-%d", w, i)
						start := time.Now()
						_, err := idem.Do(ctx, g, key, payment{Amount: 1}, fn(key))
						calls[w] = append(calls[w], loadCall{key: key, start: start, end: time.Now(), err: err})
						if i == 2 && w == 0 {
							close(frozen) // the load runs: freeze now
						}
						if err != nil {
							time.Sleep(loadPause)
						}
					}
				})
			}
			<-frozen
			s.freeze()
			time.Sleep(loadFreeze) // the freeze itself
			stop.Store(true)
			back := s.resume()
			wg.Wait()

			var all []loadCall
			for _, cs := range calls {
				all = append(all, cs...)
			}
			var slow []time.Duration
			var refused, notRecorded []string
			for _, call := range all {
				if d := call.end.Sub(call.start); d > loadBound {
					slow = append(slow, d.Round(time.Millisecond))
				}
				switch {
				case errors.Is(call.err, idem.ErrNotRecorded):
					notRecorded = append(notRecorded, call.key)
				case errors.Is(call.err, idem.ErrStoreUnavailable):
					refused = append(refused, call.key)
				case call.err != nil:
					t.Errorf("%s: %v", call.key, call.err)
				}
			}
			slices.Sort(slow)
			t.Logf("%d requests, %d refused, %d not recorded; %d answered after %v: %v", len(all), len(refused), len(notRecorded), len(slow), loadBound, slow)
			require.Empty(t, slow, "answers during the freeze took longer than %v", loadBound)
			require.NotEmpty(t, refused, "the freeze refused requests")

			time.Sleep(time.Until(back.Add(loadRetryAfter))) // the retries come 1.5 s after Redis answers
			retry := func(keys []string) (inProgress, failed []string) {
				var mu sync.Mutex
				next := atomic.Int64{}
				var wg sync.WaitGroup
				for range loadClients {
					wg.Go(func() {
						for i := int(next.Add(1) - 1); i < len(keys); i = int(next.Add(1) - 1) {
							_, err := idem.Do(ctx, g, keys[i], payment{Amount: 1}, fn(keys[i]))
							mu.Lock()
							switch {
							case errors.Is(err, idem.ErrInProgress):
								inProgress = append(inProgress, keys[i])
							case err != nil:
								failed = append(failed, keys[i]+": "+err.Error())
							}
							mu.Unlock()
						}
					})
				}
				wg.Wait()
				return inProgress, failed
			}
			inProgress, failed := retry(refused)
			t.Logf("retries of refused keys: %d in progress (409), %d failed otherwise", len(inProgress), len(failed))
			nrInProgress, nrFailed := retry(notRecorded)
			require.Empty(t, inProgress, "refused keys answered ErrInProgress on their first retry")
			require.Empty(t, failed)
			require.Empty(t, nrInProgress, "keys not recorded answered ErrInProgress on their first retry")
			require.Empty(t, nrFailed)
			for _, k := range refused {
				n, ok := runs.Load(k)
				require.True(t, ok, "refused key %s did not run on its retry", k)
				require.EqualValues(t, 1, n.(*atomic.Int32).Load(), "key %s", k)
			}
			runs.Range(func(k, n any) bool {
				require.LessOrEqual(t, n.(*atomic.Int32).Load(), int32(1), "key %s ran more than once", k)
				return true
			})
		})
	}
}
