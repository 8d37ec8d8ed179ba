//go:build unix

package idemsql_test

// Tests with real processes: a child is this test binary re-executed with
// childRoleEnv set, so that it runs TestChildProcess only, on the parent's
// database and redis-server. It reports on stdout, one JSON event a line,
// and, where a test needs it, waits for a line on stdin.

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsql"
	"github.com/idemkit/idem/internal/childtest"
)

// Environment of a child process.
const (
	childRoleEnv   = "IDEMSQL_CHILD" // "commit-then-die" or "frozen"
	childDriverEnv = "IDEMSQL_CHILD_DRIVER"
	childDSNEnv    = "IDEMSQL_CHILD_DSN"
	childRedisEnv  = "IDEMSQL_CHILD_REDIS"
	childPrefixEnv = "IDEMSQL_CHILD_PREFIX"
	childLeaseEnv  = "IDEMSQL_CHILD_LEASE"
)

// childKey is the key every child works on (each test has its own prefix
// and database).
const childKey = "key-child"

// childEvent is a line a child writes on stdout.
type childEvent struct {
	Event       string `json:"event"` // "ready", "committed", "tx", "result"
	Fence       int64  `json:"fence,omitempty"`
	Value       string `json:"value,omitempty"`
	Ran         bool   `json:"ran,omitempty"` // "tx": the child's effect ran
	Err         string `json:"err,omitempty"`
	NotRecorded bool   `json:"not_recorded,omitempty"`
	LeaseLost   bool   `json:"lease_lost,omitempty"`
}

// Name returns the event's name, for childtest.
func (e childEvent) Name() string { return e.Event }

// TestChildProcess is the body of the child processes; run directly, it
// skips.
func TestChildProcess(t *testing.T) {
	role := os.Getenv(childRoleEnv)
	if role == "" {
		t.Skip("helper process for the process tests")
	}
	if err := runChild(role); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	os.Exit(0)
}

func runChild(role string) error {
	lease, err := time.ParseDuration(os.Getenv(childLeaseEnv))
	if err != nil {
		return err
	}
	db, err := sql.Open(os.Getenv(childDriverEnv), os.Getenv(childDSNEnv))
	if err != nil {
		return err
	}
	defer db.Close()
	c := redis.NewClient(&redis.Options{Addr: os.Getenv(childRedisEnv)})
	defer c.Close()
	g := idem.New(idem.NewRedisStore(c, idem.WithPrefix(os.Getenv(childPrefixEnv))), quiet, idem.WithLease(lease))
	out := json.NewEncoder(os.Stdout)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a forgotten child ends
	defer cancel()
	v, err := idem.Do(ctx, g, childKey, payReq{Amount: 100}, func(ctx context.Context, a *idem.Attempt) (string, error) {
		switch role {
		case "commit-then-die":
			return commitThenDie(ctx, db, a, out)
		case "frozen":
			return frozen(ctx, db, a, out)
		}
		return "", fmt.Errorf("unknown role %q", role)
	})
	ev := childEvent{Event: "result", Value: v}
	if err != nil {
		ev.Err = err.Error()
		ev.NotRecorded = errors.Is(err, idem.ErrNotRecorded)
		ev.LeaseLost = errors.Is(err, idem.ErrLeaseLost)
	}
	return out.Encode(ev)
}

// childPay is the child's effect: a payment row with the child's receipt.
func childPay(ctx context.Context, tx *sql.Tx) (string, error) {
	_, err := tx.ExecContext(ctx, `INSERT INTO payments (op, receipt) VALUES ('child', 'receipt-child')`)
	return "receipt-child", err
}

// commitThenDie commits, reports it and waits for SIGKILL: the process dies
// between the commit and Redis's complete.
func commitThenDie(ctx context.Context, db *sql.DB, a *idem.Attempt, out *json.Encoder) (string, error) {
	if _, err := idemsql.Tx(ctx, db, a, childPay); err != nil {
		return "", err
	}
	if err := out.Encode(childEvent{Event: "committed", Fence: a.Fence}); err != nil {
		return "", err
	}
	<-ctx.Done()
	return "", errors.New("not killed in time")
}

// frozen reports that it holds the key, waits for a line on stdin (the
// parent freezes it meanwhile), then runs its transaction on a context
// that ignores the lease loss: the worst-behaved stale holder.
func frozen(ctx context.Context, db *sql.DB, a *idem.Attempt, out *json.Encoder) (string, error) {
	if err := out.Encode(childEvent{Event: "ready", Fence: a.Fence}); err != nil {
		return "", err
	}
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return "", err
	}
	ran := false
	v, err := idemsql.Tx(context.WithoutCancel(ctx), db, a, func(ctx context.Context, tx *sql.Tx) (string, error) {
		ran = true
		return childPay(ctx, tx)
	})
	ev := childEvent{Event: "tx", Value: v, Ran: ran}
	if err != nil {
		ev.Err = err.Error()
	}
	return v, errors.Join(err, out.Encode(ev))
}

// startChild runs this test binary as a child in role, on d and the Redis
// at addr under prefix.
func startChild(t *testing.T, role string, d database, addr, prefix string, lease time.Duration) *childtest.Child[childEvent] {
	t.Helper()
	dsn := d.dsn
	if d.driver != "sqlite" {
		dsn += "&application_name=idemsql-child" // to find its session in pg_stat_activity
	}
	return childtest.Start[childEvent](t, "TestChildProcess", 60*time.Second, childRoleEnv+"="+role, childDriverEnv+"="+d.driver,
		childDSNEnv+"="+dsn, childRedisEnv+"="+addr, childPrefixEnv+"="+prefix, childLeaseEnv+"="+lease.String())
}
