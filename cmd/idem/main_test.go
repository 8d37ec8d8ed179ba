package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/redistest"
)

// asCommandEnv makes the test binary run the command itself (TestBinary).
const asCommandEnv = "IDEM_CLI_TEST_AS_COMMAND"

func TestMain(m *testing.M) {
	if os.Getenv(asCommandEnv) != "" {
		main() // the arguments are the command's: TestBinary passes no test flags
	}
	code := m.Run()
	redistest.StopShared()
	os.Exit(code)
}

// cli runs the command line and returns its exit status and output.
func cli(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// seeded is a store holding one operation in each state, under a prefix
// of the test's own.
type seeded struct {
	url, prefix string
	store       *idem.RedisStore
}

// seed writes: Do "paid" completed; HTTP "k-http" in scope "tenant-1"
// completed with 201; Do "running" held by a live lease; Do "crashed"
// released with a checkpoint.
func seed(t *testing.T, url string, c redis.UniversalClient) seeded {
	t.Helper()
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	s := idem.NewRedisStore(c, idem.WithPrefix(prefix))
	g := idem.New(s)
	_, err := idem.Do(ctx, g, "paid", "req", func(context.Context, *idem.Attempt) (string, error) { return "receipt-1", nil })
	require.NoError(t, err)

	h := g.Middleware(idem.WithScope(func(*http.Request) string { return "tenant-1" }))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/payments/42")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":42}`))
	}))
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":1000}`))
	r.Header.Set("Idempotency-Key", `"k-http"`)
	h.ServeHTTP(httptest.NewRecorder(), r)

	claim := func(key, owner string) string {
		id := idem.OperationID(idem.KindDo, "", key)
		res, err := s.Claim(ctx, id, idemstore.ClaimRequest{Owner: owner, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		require.NoError(t, err)
		require.Equal(t, idemstore.ClaimOK, res.Status)
		return id
	}
	claim("running", "o-running")
	id := claim("crashed", "o-crashed")
	require.NoError(t, s.Checkpoint(ctx, id, "o-crashed", "charge_id", []byte("ch_1")))
	require.NoError(t, s.Release(ctx, id, "o-crashed"))
	return seeded{url: url, prefix: prefix, store: s}
}

// inspectJSON runs inspect -json and decodes its output.
func inspectJSON(t *testing.T, args ...string) inspection {
	t.Helper()
	code, out, errOut := cli(t, append([]string{"inspect", "-json"}, args...)...)
	require.Equal(t, exitOK, code, errOut)
	var in inspection
	require.NoError(t, json.Unmarshal([]byte(out), &in), out)
	require.Equal(t, 1, strings.Count(out, "\n"), "one JSON object on one line")
	return in
}

func TestInspectCommand(t *testing.T) {
	srv := redistest.Shared(t)
	url := "redis://" + srv.Addr()
	s := seed(t, url, srv.Client(t))
	flags := []string{"-redis", url, "-prefix", s.prefix}

	in := inspectJSON(t, append(flags, "paid")...)
	require.Equal(t, "completed", in.State)
	require.Equal(t, int64(1), in.Fence)
	require.Equal(t, &storedResult{Type: "string", Size: len("receipt-1")}, in.Result)
	require.WithinDuration(t, time.Now(), *in.Created, 5*time.Second)
	require.InDelta(t, (24 * time.Hour).Milliseconds(), in.TTLMs, 5000)

	in = inspectJSON(t, append(flags, "-kind", "http", "-scope", "tenant-1", "k-http")...)
	require.Equal(t, "completed", in.State)
	require.Equal(t, &storedResult{Type: "response", Status: 201, Size: len(`{"id":42}`),
		Headers: map[string][]string{"Content-Type": {"application/json"}, "Location": {"/payments/42"}}}, in.Result)

	quoted := inspectJSON(t, append(flags, "-kind", "http", "-scope", "tenant-1", `"k-http"`)...)
	require.Equal(t, in.ID, quoted.ID, "a key copied with its quotes from the header names the same operation")
	require.Equal(t, "k-http", quoted.Key)

	in = inspectJSON(t, append(flags, "running")...)
	require.Equal(t, "in_progress", in.State)
	require.True(t, in.Held)
	require.Equal(t, "o-running", in.LeaseHolder)
	require.InDelta(t, time.Minute.Milliseconds(), in.LeaseTTLMs, 5000)

	in = inspectJSON(t, append(flags, "crashed")...)
	require.Equal(t, "in_progress", in.State)
	require.False(t, in.Held)
	require.Equal(t, map[string][]byte{"charge_id": []byte("ch_1")}, in.Checkpoints)

	in = inspectJSON(t, append(flags, "never-used")...)
	require.Equal(t, "absent", in.State)
	require.Zero(t, in.Fence)
	require.Equal(t, idem.OperationID(idem.KindDo, "", "never-used"), in.ID)

	// For people.
	code, out, _ := cli(t, append([]string{"inspect"}, append(flags, "-kind", "http", "-scope", "tenant-1", "k-http")...)...)
	require.Equal(t, exitOK, code)
	for _, want := range []string{`http key "k-http" in scope "tenant-1"`, "state        completed", "HTTP response 201, body 9 B", "Location: /payments/42"} {
		require.Contains(t, out, want)
	}
	code, out, _ = cli(t, append([]string{"inspect"}, append(flags, "crashed")...)...)
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "not held: released or abandoned; the next request takes over as attempt 2")
	require.Contains(t, out, `"charge_id" = "ch_1"`)
}

func TestForgetCommand(t *testing.T) {
	srv := redistest.Shared(t)
	url := "redis://" + srv.Addr()
	s := seed(t, url, srv.Client(t))
	flags := []string{"forget", "-redis", url, "-prefix", s.prefix}
	state := func(key string) string { return inspectJSON(t, "-redis", url, "-prefix", s.prefix, key).State }

	code, out, errOut := cli(t, append(flags, "paid")...)
	require.Equal(t, exitFail, code)
	require.Contains(t, out, "state        completed", "shows what it would delete")
	require.Equal(t, "idem forget: not forgotten: pass -yes to delete this record\n", errOut)
	require.Equal(t, "completed", state("paid"), "changes nothing without -yes")

	code, out, _ = cli(t, append(flags, "-yes", "paid")...)
	require.Equal(t, exitOK, code)
	require.Regexp(t, `^forgot \S+ \(completed, fence 1\): the next request with this key runs as new\n$`, out)
	require.Equal(t, "absent", state("paid"))

	code, out, _ = cli(t, append(flags, "-yes", "paid")...)
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "nothing to forget")

	code, _, errOut = cli(t, append(flags, "-yes", "running")...)
	require.Equal(t, exitFail, code)
	require.Regexp(t, `^idem forget: refused: a live lease holds the operation for [0-9hms.]+ more`, errOut)
	require.Equal(t, 1, strings.Count(errOut, "\n"))
	require.Equal(t, "in_progress", state("running"))

	code, out, _ = cli(t, append(flags, "-yes", "-force", "running")...)
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "(in_progress, held, fence 1)")
	require.Equal(t, "absent", state("running"))
}

func TestScanCommand(t *testing.T) {
	srv := redistest.Shared(t)
	url := "redis://" + srv.Addr()
	s := seed(t, url, srv.Client(t))

	scanJSON := func(args ...string) scanReport {
		t.Helper()
		code, out, errOut := cli(t, append([]string{"scan", "-json", "-redis", url, "-prefix", s.prefix}, args...)...)
		require.Equal(t, exitOK, code, errOut)
		var rep scanReport
		require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
		return rep
	}
	rep := scanJSON()
	require.True(t, rep.Complete)
	require.Equal(t, 4, rep.Sampled)
	require.Equal(t, map[string]int{"completed": 2, "in_progress": 1, "released": 1}, rep.States)
	require.Zero(t, rep.NoTTL)
	require.Greater(t, rep.Memory.Min, 100.0)
	require.Equal(t, rep.Memory.Total, rep.Memory.Mean*4)
	require.InDelta(t, 24*3600, rep.TTL.Max, 120)
	require.Len(t, rep.Buckets, 5)

	rep = scanJSON("-sample", "2")
	require.False(t, rep.Complete)
	require.Equal(t, 2, rep.Sampled)

	code, out, _ := cli(t, "scan", "-redis", url, "-prefix", s.prefix)
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "records read     4 (every record: the counts are totals)")
	require.Regexp(t, `memory/record +min \d+ B`, out)

	code, out, _ = cli(t, "scan", "-redis", url, "-prefix", s.prefix+"-none")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "no records under prefix")

	// The prefix is matched as it is: glob characters are escaped.
	code, out, _ = cli(t, "scan", "-redis", url, "-prefix", s.prefix[:3]+"*")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "no records under prefix")
}

func TestCheckCommand(t *testing.T) {
	srv := redistest.Shared(t)
	url := "redis://" + srv.Addr()
	code, out, errOut := cli(t, "check", "-redis", url)
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, serverLine(srv.Addr()), out)
	for _, want := range []string{"maxmemory-policy noeviction", "persistence  none",
		"warning: " + srv.Addr() + ": no persistence", "ok: idem can use " + srv.Addr() + " (1 warning(s))"} {
		require.Contains(t, out, want)
	}
	code, _, errOut = cli(t, "check", "-strict", "-redis", url)
	require.Equal(t, exitFail, code)
	require.Equal(t, "idem check: 1 warning(s) (-strict)\n", errOut)

	own := redistest.Start(t, redistest.WithArgs("--maxmemory-policy", "allkeys-lru", "--appendonly", "yes"))
	code, out, _ = cli(t, "check", "-redis", "redis://"+own.Addr())
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "warning: Redis may evict idempotency records under memory pressure; set maxmemory-policy noeviction")
	require.Contains(t, out, "AOF on")
}
