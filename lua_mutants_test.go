package idem

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/luamut"
)

// The mutation run of lua/*.lua (docs/testing.md): TestLuaMutants makes
// every mutant of every script (internal/luamut) and runs the store's tests
// against each, in a child process of this test binary that swaps the
// script's source for the mutant (IDEM_LUA_MUTANT). A mutant is killed when
// a test fails; one the tests pass with lives. It runs only with
// IDEM_MUTATE_LUA=1: `scripts/mutation lua`.

// luaMutantEnv names the mutant a child process runs with, by its ID.
const luaMutantEnv = "IDEM_LUA_MUTANT"

// storeScripts are the scripts of lua/, by file name: the script the store
// runs and the variable holding its source.
var storeScripts = map[string]struct {
	script *luaScript
	src    *string
}{
	"claim.lua":      {claimScript, &claimLua},
	"heartbeat.lua":  {heartbeatScript, &heartbeatLua},
	"checkpoint.lua": {checkpointScript, &checkpointLua},
	"complete.lua":   {completeScript, &completeLua},
	"release.lua":    {releaseScript, &releaseLua},
	"unclaim.lua":    {unclaimScript, &unclaimLua},
	"forget.lua":     {forgetScript, &forgetLua},
	"probe.lua":      {probeScript, &probeLua},
}

// luaStages are the tests a mutant runs, in order, until one kills it: the
// store contract (idemtest) and the tests of the scripts' own paths, first on
// miniredis (in-process, fast), then on a real redis-server.
var luaStages = []luaStage{
	{"miniredis", `^TestRedisStoreContractMiniredis$`, false},
	{"redis-server", `^(TestRedisStoreContractRedisServer|TestScriptsAgreeOnLayout|TestClaimScriptPaths|TestCreatedArg|TestClaimScriptTombstonePaths|TestClaimReplayComparesInGo|` +
		`TestCheckpointScriptPaths|TestScriptErrorsNameTheRecord|TestClaimScriptTouchesReplays|TestClaimScriptLeasePaths|` +
		`TestClaimScriptLastMillisecond|TestCompleteScriptPaths|TestUnclaimScriptPaths|TestScriptsPublish|TestCompleteScriptPublishRefused|TestWaiterIsNotified|TestForgetNotifiesWaiters|` +
		`TestRedisStoreReplicaAck|TestInspect|TestInspectResults|TestForget|TestForgetLiveLease|TestForgetWaitsForReplicas|` +
		`TestCheckProbes|TestCheckWithoutConfig|TestRedisStoreCheck|TestCheckAuthentication)$`, true},
}

// luaStage is one run of tests against a mutant.
type luaStage struct {
	name   string
	run    string // the -test.run pattern
	server bool   // needs redis-server
}

// luaEquivalent are the reviewed survivors: mutants no test can kill,
// because the mutated script behaves the same, by ID, with the reason.
var luaEquivalent = map[string]string{
	`checkpoint.lua:23:9 boundary "<=" -> "<"`:    "the loop ends at #v+1 after the last entry; i = #v would be an entry of one byte, and the shortest is four (0:0:)",
	`checkpoint.lua:27:38 constant "1" -> "2"`:    "the search for the value's colon starts on the first digit of the value's length, never a colon, instead of just before it",
	`claim.lua:59:56 constant "1" -> "2"`:         "the floor of the wait told when the lease ran out between SET NX and PTTL (-2): any positive floor makes the claimant claim again",
	`claim.lua:66:34 constant "2" -> "3"`:         "string.byte returns a third byte that nothing reads",
	`claim.lua:70:12 boundary ">" -> ">="`:        "a completed record with PTTL 0 is in its last millisecond: touched or not, it is gone before a replica could serve it",
	`claim.lua:70:14 constant "0" -> "1"`:         "as above, for a record with one millisecond left",
	`claim.lua:90:6 branch "not kid" -> "false"`:  "a plain stored fingerprint met by a keyed request: the loop after it finds no listed (keyed) fingerprint equal to it or with its absent key id, and returns the same {5}",
	`claim.lua:122:10 boundary ">" -> ">="`:       "a lease with PTTL 0 (its last millisecond) is taken over, or waited for one millisecond: no test can arrange PTTL 0 (miniredis deletes the key, a real server's clock moves)",
	`forget.lua:15:28 boundary ">" -> ">="`:       "a lease with PTTL 0 (its last millisecond) is forgotten or refused: no test can arrange PTTL 0",
	`forget.lua:15:30 constant "0" -> "1"`:        "a lease with one millisecond left is forgotten or refused, a timing no test can hold on a real server",
	`probe.lua:16:13 constant "10000" -> "10001"`: "the TTL of the probe's key (SET, then PEXPIRE), which the probe deletes again",
}

func init() {
	id := os.Getenv(luaMutantEnv)
	if id == "" {
		return
	}
	for name, s := range storeScripts {
		for _, m := range luamut.Mutants(name, *s.src) {
			if m.ID() == id {
				direct := s.script.direct
				*s.script = *newScript(m.Src)
				s.script.direct = direct
				*s.src = m.Src
				return
			}
		}
	}
	fmt.Fprintf(os.Stderr, "%s: no mutant %q\n", luaMutantEnv, id)
	os.Exit(3)
}

// luaMutant is one mutant's verdict.
type luaMutant struct {
	id      string
	verdict string // killed, lived, timed out
	stage   string // the stage that killed it
}

func TestLuaMutants(t *testing.T) {
	if os.Getenv("IDEM_MUTATE_LUA") != "1" {
		t.Skip("the mutation run of lua/*.lua: IDEM_MUTATE_LUA=1 (scripts/mutation lua)")
	}
	stages := luaStages
	if _, err := exec.LookPath("redis-server"); err != nil {
		require.NotEqual(t, "1", os.Getenv("IDEM_REQUIRE_REDIS"), "redis-server is not on PATH")
		t.Log("redis-server is not on PATH: the mutants run on miniredis only")
		stages = stages[:1]
	}
	var ids []string
	only := os.Getenv("IDEM_MUTATE_LUA_ONLY") // e.g. "claim.lua,release.lua"
	for _, name := range slices.Sorted(maps.Keys(storeScripts)) {
		if only == "" || slices.Contains(strings.Split(only, ","), name) {
			for _, m := range luamut.Mutants(name, *storeScripts[name].src) {
				ids = append(ids, m.ID())
			}
		}
	}
	require.NotEmpty(t, ids)

	// The unmutated scripts pass every stage; its time sets the stage's timeout.
	timeouts := make([]time.Duration, len(stages))
	for i, st := range stages {
		start := time.Now()
		out, err := runLuaStage(t.Context(), "", st.run, 10*time.Minute)
		require.NoError(t, err, "the tests fail without a mutant:\n%s", out)
		timeouts[i] = max(20*time.Since(start), time.Minute)
	}

	workers, _ := strconv.Atoi(os.Getenv("IDEM_MUTATE_LUA_WORKERS"))
	results := make([]luaMutant, len(ids))
	var wg sync.WaitGroup
	next := make(chan int)
	for range max(workers, 1) {
		wg.Go(func() {
			for i := range next {
				results[i] = judgeLuaMutant(t.Context(), ids[i], stages, timeouts)
				t.Logf("%-9s %-12s %s", results[i].verdict, results[i].stage, ids[i])
			}
		})
	}
	for i := range ids {
		next <- i
	}
	close(next)
	wg.Wait()
	reportLuaMutants(t, results)
}

// judgeLuaMutant runs the stages against one mutant until one kills it. A
// kill on a real server is confirmed by a second run, so that a test that
// flaked under load kills nothing.
func judgeLuaMutant(ctx context.Context, id string, stages []luaStage, timeouts []time.Duration) luaMutant {
	for i, st := range stages {
		_, err := runLuaStage(ctx, id, st.run, timeouts[i])
		if err == nil {
			continue
		}
		if st.server && err != errLuaTimeout {
			_, err = runLuaStage(ctx, id, st.run, timeouts[i])
			if err == nil {
				continue
			}
		}
		if err == errLuaTimeout {
			return luaMutant{id: id, verdict: "timed out", stage: st.name}
		}
		return luaMutant{id: id, verdict: "killed", stage: st.name}
	}
	return luaMutant{id: id, verdict: "lived"}
}

// errLuaTimeout is a stage that ran out of time.
var errLuaTimeout = fmt.Errorf("timed out")

// runLuaStage runs the tests matching pattern in a child process with the
// mutant id ("" for none) and returns their output; err is nil when they
// pass.
func runLuaStage(ctx context.Context, id, pattern string, timeout time.Duration) ([]byte, error) {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", pattern, "-test.count=1", "-test.failfast",
		"-test.timeout", timeout.String())
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(e string) bool {
		return strings.HasPrefix(e, "IDEM_MUTATE_LUA=") || strings.HasPrefix(e, luaMutantEnv+"=")
	}), luaMutantEnv+"="+id)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if cmd.ProcessState != nil && cmd.ProcessState.ExitCode() == 3 {
		panic(out.String()) // the child knows no such mutant: the runner's own defect
	}
	if err != nil && bytes.Contains(out.Bytes(), []byte("panic: test timed out")) {
		return out.Bytes(), errLuaTimeout
	}
	return out.Bytes(), err
}

// reportLuaMutants prints the figures per script and fails on a survivor
// that is not a reviewed equivalent.
func reportLuaMutants(t *testing.T, results []luaMutant) {
	t.Helper()
	type tally struct{ killed, lived, timedOut int }
	per := map[string]*tally{}
	var all tally
	var unreviewed []string
	for _, r := range results {
		script := r.id[:strings.IndexByte(r.id, ':')]
		if per[script] == nil {
			per[script] = &tally{}
		}
		for _, c := range []*tally{per[script], &all} {
			switch r.verdict {
			case "killed":
				c.killed++
			case "lived":
				c.lived++
			default:
				c.timedOut++
			}
		}
		if r.verdict != "killed" {
			if why, ok := luaEquivalent[r.id]; ok {
				t.Logf("equivalent %s: %s", r.id, why)
			} else {
				unreviewed = append(unreviewed, r.verdict+" "+r.id)
			}
		} else if _, ok := luaEquivalent[r.id]; ok {
			t.Errorf("%s is listed as equivalent but was killed: remove it from luaEquivalent", r.id)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| script | mutants | killed | lived | timed out | score |\n|---|---|---|---|---|---|\n")
	row := func(name string, c tally) {
		n := c.killed + c.lived + c.timedOut
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %.2f |\n", name, n, c.killed, c.lived, c.timedOut, float64(c.killed)/float64(n))
	}
	for _, s := range slices.Sorted(maps.Keys(per)) {
		row("`lua/"+s+"`", *per[s])
	}
	row("all", all)
	t.Logf("Lua mutants:\n%s", b.String())
	if out := os.Getenv("IDEM_MUTATE_LUA_OUT"); out != "" {
		require.NoError(t, os.WriteFile(out, []byte(b.String()), 0o644))
	}
	for _, u := range unreviewed {
		t.Errorf("survivor not reviewed: %s", u)
	}
}
