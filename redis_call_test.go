package idem_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// printedCommands keeps what go-redis prints for each command: what a
// tracing or logging hook records.
type printedCommands struct {
	mu  sync.Mutex
	got []string
}

func (p *printedCommands) DialHook(next redis.DialHook) redis.DialHook { return next }
func (p *printedCommands) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (p *printedCommands) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		p.mu.Lock()
		p.got = append(p.got, cmd.String())
		p.mu.Unlock()
		return next(ctx, cmd)
	}
}

// The store hands go-redis its script arguments without boxing each one;
// a hook still sees them as text: keys, owner token, stored payload.
func TestScriptArgumentsPrintAsText(t *testing.T) {
	forEachBackend(t, testScriptArgumentsPrintAsText)
}

func testScriptArgumentsPrintAsText(t *testing.T, b *backend) {
	c := redis.NewClient(b.options())
	t.Cleanup(func() { _ = c.Close() })
	hook := &printedCommands{}
	c.AddHook(hook)
	st := idem.NewRedisStore(c, idem.WithPrefix(b.prefix))
	g := idem.New(st)
	var id string
	_, err := idem.Do(context.Background(), g, "k1", "req", func(ctx context.Context, a *idem.Attempt) (string, error) {
		id = a.ID
		return "the-result", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	record, lease := st.Keys(id)
	hook.mu.Lock()
	defer hook.mu.Unlock()
	var claim, complete string
	for _, s := range hook.got {
		switch {
		case strings.Contains(s, "the-result"):
			complete = s
		case strings.HasPrefix(s, "evalsha") && claim == "":
			claim = s
		}
	}
	for _, s := range []string{claim, complete} {
		if !strings.Contains(s, " "+record+" "+lease+" ") {
			t.Errorf("printed command %q lacks the keys %s %s", s, record, lease)
		}
		if strings.Contains(s, "0xc") {
			t.Errorf("printed command %q shows a pointer", s)
		}
	}
	if complete == "" {
		t.Fatalf("no printed command carries the stored result: %q", hook.got)
	}
}
