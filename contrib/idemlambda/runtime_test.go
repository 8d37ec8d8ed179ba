package idemlambda_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemlambda"
	"github.com/idemkit/idem/internal/childtest"
	"github.com/idemkit/idem/internal/redistest"
)

// The environment of an instance run as a child process.
const (
	roleEnv  = "IDEMLAMBDA_TEST_ROLE" // charge; hang: run past the deadline; bare: without idem
	redisEnv = "IDEMLAMBDA_TEST_REDIS"
	waitEnv  = "IDEMLAMBDA_TEST_WAIT" // the Guard's WithWait
	tellEnv  = "IDEMLAMBDA_TEST_TELL" // true: report each run on the standard output
)

// instanceEvent is what an instance reports on its standard output.
type instanceEvent struct {
	Event string `json:"event"`
	Fence int64  `json:"fence,omitempty"`
	ID    string `json:"id,omitempty"`
}

func (e instanceEvent) Name() string { return e.Event }

// TestRuntimeInstance is a Lambda function's instance, run by the tests
// below as a child process: lambda.Start against their emulated Runtime API.
func TestRuntimeInstance(t *testing.T) {
	role := os.Getenv(roleEnv)
	if role == "" {
		t.Skip("a Lambda instance for the runtime tests")
	}
	wait, err := time.ParseDuration(os.Getenv(waitEnv))
	if err != nil {
		t.Fatal(err)
	}
	// Made once per instance, outside the handler: the client and its
	// connections survive from one invocation to the next.
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(redisEnv)})
	g := idem.New(idem.NewRedisStore(rdb), idem.WithLease(30*time.Second), idem.WithWait(wait))
	var mu sync.Mutex
	out := json.NewEncoder(os.Stdout)
	report := func(ev instanceEvent) {
		if os.Getenv(tellEnv) != "true" {
			return // nobody reads
		}
		mu.Lock()
		defer mu.Unlock()
		_ = out.Encode(ev)
	}
	if role == "bare" { // the same side effect, unprotected: the baseline of a cold start
		lambda.Start(func(ctx context.Context, o Order) (Receipt, error) {
			n, err := rdb.Incr(ctx, "charges/"+o.RequestID).Result()
			return Receipt{Charge: fmt.Sprintf("ch_%d", n), Amount: o.Amount}, err
		})
	}
	lambda.Start(idemlambda.Handler(g, orderKey, func(ctx context.Context, o Order) (Receipt, error) {
		a, _ := idem.AttemptFrom(ctx)
		report(instanceEvent{Event: "charging", Fence: a.Fence, ID: a.ID})
		if role == "hang" {
			time.Sleep(time.Hour) // past the deadline, until Lambda stops the instance
		}
		n, err := rdb.Incr(ctx, "charges/"+o.RequestID).Result() // the side effect, counted
		if err != nil {
			return Receipt{}, err
		}
		return Receipt{Charge: fmt.Sprintf("ch_%d_%s", n, a.ID), Amount: o.Amount, Fence: a.Fence}, nil
	}))
}

// startInstance starts an instance of the payments function in role, with
// a Runtime API of its own. An instance that tells (reports each run) must
// have its events read.
func startInstance(t *testing.T, role, redisAddr string, wait time.Duration, tell bool) (*runtimeAPI, *childtest.Child[instanceEvent]) {
	t.Helper()
	api := newRuntimeAPI(t)
	c := childtest.Start[instanceEvent](t, "TestRuntimeInstance", time.Minute,
		roleEnv+"="+role, redisEnv+"="+redisAddr, waitEnv+"="+wait.String(), fmt.Sprintf("%s=%t", tellEnv, tell),
		"AWS_LAMBDA_RUNTIME_API="+api.Addr(), "AWS_LAMBDA_FUNCTION_NAME=payments",
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE=128", "AWS_LAMBDA_FUNCTION_VERSION=$LATEST")
	return api, c
}

func orderPayload(t *testing.T, o Order) []byte {
	t.Helper()
	b, err := json.Marshal(o)
	require.NoError(t, err)
	return b
}

func TestRuntimeSevenDeliveries(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	apiA, _ := startInstance(t, "charge", srv.Addr(), 20*time.Second, false)
	apiB, _ := startInstance(t, "charge", srv.Addr(), 20*time.Second, false)
	payload := orderPayload(t, Order{RequestID: "req-7", Customer: "cus_1", Amount: 1000})

	// One event delivered seven times: the two instances take the first
	// two together, then the rest one after another.
	var invs []*invocation
	for i := range 7 {
		api := apiA
		if i%2 == 1 {
			api = apiB
		}
		invs = append(invs, api.Invoke(payload, 30*time.Second))
	}
	var first []byte
	for _, inv := range invs {
		ans := inv.Wait(t)
		require.False(t, ans.failed, "%s", ans.body)
		if first == nil {
			first = ans.body
		}
		require.Equal(t, string(first), string(ans.body), "every delivery answers alike")
	}
	require.Equal(t, int64(1), decode[Receipt](t, first).Fence)
	charges, err := srv.Client(t).Get(context.Background(), "charges/req-7").Int()
	require.NoError(t, err)
	require.Equal(t, 1, charges, "one charge")
}

func TestRuntimeKilledAtDeadline(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	apiA, a := startInstance(t, "hang", srv.Addr(), 0, true)
	apiB, b := startInstance(t, "charge", srv.Addr(), 0, true) // no wait: a busy key is refused at once
	payload := orderPayload(t, Order{RequestID: "req-9", Customer: "cus_1", Amount: 1000})

	inv := apiA.Invoke(payload, 2*time.Second) // the function's timeout
	ev := a.Next(t, "charging")
	require.Equal(t, int64(1), ev.Fence)

	// Lambda stops the instance at its deadline, mid-charge.
	time.Sleep(time.Until(inv.deadline))
	a.Signal(t, syscall.SIGKILL)
	require.Error(t, a.Wait(t))

	// Its lease ends a second after the deadline, not 30 s after the claim.
	_, leaseKey := idem.NewRedisStore(srv.Client(t)).Keys(ev.ID)
	end := inv.deadline.Add(time.Second)
	before := time.Now()
	pttl, err := srv.Client(t).PTTL(context.Background(), leaseKey).Result()
	require.NoError(t, err)
	require.LessOrEqual(t, pttl, end.Sub(before)+5*time.Millisecond, "the lease outlives the deadline by a second at most")
	if before.Before(end.Add(-100 * time.Millisecond)) {
		require.Positive(t, pttl, "the lease holds until then")
	}

	// Lambda retries the event 1.5 s after the deadline, on another
	// instance: it runs at once, as attempt 2.
	time.Sleep(time.Until(inv.deadline.Add(1500 * time.Millisecond)))
	ans := apiB.Invoke(payload, 5*time.Second).Wait(t)
	require.False(t, ans.failed, "%s", ans.body)
	require.Equal(t, int64(2), decode[Receipt](t, ans.body).Fence)
	retried := b.Next(t, "charging")
	require.Equal(t, int64(2), retried.Fence)
	require.Equal(t, ev.ID, retried.ID, "the same operation")
}

// TestColdStart measures what a cold start costs: an instance's
// initialisation (process start to its first request for an invocation)
// and its first invocation (the Redis connection dialled; for the first
// instance on a Redis, the scripts loaded too), against warm invocations
// and replays, and against a function without idem (the same side effect,
// one Redis command). Run it with -v to see the figures; they are measured,
// not asserted.
func TestColdStart(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, instance := range []string{"without idem", "first instance", "second instance"} {
		role := "charge"
		if instance == "without idem" {
			role = "bare"
		}
		started := time.Now()
		api, _ := startInstance(t, role, srv.Addr(), 0, false)
		initDone := api.firstPoll(t)
		run := func(key string) time.Duration {
			inv := api.Invoke(orderPayload(t, Order{RequestID: key, Amount: 1}), 10*time.Second)
			ans := inv.Wait(t)
			require.False(t, ans.failed, "%s", ans.body)
			return ans.at.Sub(inv.handed)
		}
		first := run(instance + "-0")
		var fresh, replays []time.Duration
		for i := 1; i <= 20; i++ {
			fresh = append(fresh, run(fmt.Sprintf("%s-%d", instance, i)))
		}
		for i := 1; i <= 20; i++ {
			replays = append(replays, run(fmt.Sprintf("%s-%d", instance, i)))
		}
		t.Logf("%s: init %v; first invocation %v; warm: fresh median %v (max %v), replay median %v (20 each)",
			instance, initDone.Sub(started).Round(time.Microsecond), first.Round(time.Microsecond),
			median(fresh), slices.Max(fresh).Round(time.Microsecond), median(replays))
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2].Round(time.Microsecond)
}
