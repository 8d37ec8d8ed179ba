package idem_test

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// stackHook records, for each script sent, whether it was the completion
// (it carries the result) and whether it was sent from the goroutine that
// called Do.
type stackHook struct {
	mu                        sync.Mutex
	claims, claimsApart       int
	completes, completesApart int
}

func (h *stackHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *stackHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *stackHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.HasPrefix(cmd.Name(), "eval") {
			buf := make([]byte, 64<<10)
			apart := !strings.Contains(string(buf[:runtime.Stack(buf, false)]), "TestCompletionGoroutine")
			complete := strings.Contains(cmd.String(), "the-stored-result")
			h.mu.Lock()
			switch {
			case complete && apart:
				h.completesApart++
			case complete:
				h.completes++
			case apart:
				h.claimsApart++
			default:
				h.claims++
			}
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

// TestCompletionGoroutine: with ContextTimeoutEnabled, go-redis returns by
// the context's deadline, so every store call, bounded by the store
// timeout, is sent from the caller's goroutine; with go-redis defaults each
// runs on a goroutine of its own, which the caller stops waiting for at the
// timeout (TestSlowCompleteIsBounded covers both timings).
func TestCompletionGoroutine(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		for _, ctxTimeout := range []bool{false, true} {
			o := b.options()
			o.ContextTimeoutEnabled = ctxTimeout
			c := redis.NewClient(o)
			t.Cleanup(func() { _ = c.Close() })
			h := &stackHook{}
			c.AddHook(h)
			g := idem.New(idem.NewRedisStore(c, idem.WithPrefix(b.prefix)))
			_, err := idem.Do(context.Background(), g, "completion-"+map[bool]string{false: "apart", true: "inline"}[ctxTimeout], "req",
				func(ctx context.Context, a *idem.Attempt) (string, error) { return "the-stored-result", nil })
			if err != nil {
				t.Fatal(err)
			}
			inline, apart := h.claims+h.completes, h.claimsApart+h.completesApart
			switch {
			case h.claims+h.claimsApart == 0 || h.completes+h.completesApart == 0:
				t.Errorf("ContextTimeoutEnabled=%v: claims %d/%d, completions %d/%d: want both sent", ctxTimeout, h.claims, h.claimsApart, h.completes, h.completesApart)
			case ctxTimeout && apart != 0:
				t.Errorf("ContextTimeoutEnabled: calls sent inline/apart = %d/%d, want all inline", inline, apart)
			case !ctxTimeout && inline != 0:
				t.Errorf("go-redis defaults: calls sent inline/apart = %d/%d, want all apart", inline, apart)
			}
		}
	})
}
