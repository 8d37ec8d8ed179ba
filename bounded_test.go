package idem_test

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// stackHook counts the scripts sent from the goroutine that called Do
// (inline) and from any other (apart).
type stackHook struct {
	mu            sync.Mutex
	inline, apart int
}

func (h *stackHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *stackHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *stackHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.HasPrefix(cmd.Name(), "eval") {
			buf := make([]byte, 64<<10)
			stack := string(buf[:runtime.Stack(buf, false)])
			h.mu.Lock()
			if strings.Contains(stack, "TestCompletionGoroutine") {
				h.inline++
			} else {
				h.apart++
			}
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

// TestCompletionGoroutine: with ContextTimeoutEnabled, go-redis returns by
// the context's deadline, so the completion bounded by WithWriteTimeout is
// sent from the caller's goroutine; with go-redis defaults it runs on a
// goroutine of its own, which the caller stops waiting for at the timeout
// (TestSlowCompleteIsBounded covers both timings). The claim always runs on
// the caller's goroutine. Each script is sent twice on a fresh server
// (EVALSHA, NOSCRIPT, EVAL).
func TestCompletionGoroutine(t *testing.T) {
	for _, ctxTimeout := range []bool{false, true} {
		c := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr(), ContextTimeoutEnabled: ctxTimeout})
		t.Cleanup(func() { _ = c.Close() })
		h := &stackHook{}
		c.AddHook(h)
		g := idem.New(idem.NewRedisStore(c))
		_, err := idem.Do(context.Background(), g, "k", "req", func(ctx context.Context, a *idem.Attempt) (string, error) {
			return "v", nil
		})
		if err != nil {
			t.Fatal(err)
		}
		wantInline, wantApart := 2, 2
		if ctxTimeout {
			wantInline, wantApart = 4, 0
		}
		if h.inline != wantInline || h.apart != wantApart {
			t.Errorf("ContextTimeoutEnabled=%v: scripts sent inline/apart = %d/%d, want %d/%d",
				ctxTimeout, h.inline, h.apart, wantInline, wantApart)
		}
	}
}
