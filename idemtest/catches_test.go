package idemtest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// brokenEnv, in the environment of a child process of the test binary, lets
// TestBrokenStoresChild run the checks against the broken stores.
const brokenEnv = "IDEMTEST_BROKEN_STORES"

// broken is a store with a defect, and the checks of Run that must catch it;
// every other check must pass, or skip when listed in skip.
type broken struct {
	name       string
	new        func() (idemstore.Store, func(time.Duration))
	fail, skip []string
}

// brokenStores are the defects of broken_test.go, each with the checks it
// breaks.
func brokenStores() []broken {
	mem := func(wrap func(m *MemoryStore) idemstore.Store) func() (idemstore.Store, func(time.Duration)) {
		return func() (idemstore.Store, func(time.Duration)) {
			m := NewMemoryStore()
			return wrap(m), m.Advance
		}
	}
	fix := func(f func(r *idemstore.Record)) func() (idemstore.Store, func(time.Duration)) {
		return mem(func(m *MemoryStore) idemstore.Store { return readFix{m, f} })
	}
	// The last two checks run only on an idemstore.Unclaimer.
	unclaimChecks := []string{"UnclaimTakesFenceBack", "UnclaimRefusesLateCopy"}
	var everyCheck []string
	for _, ch := range checks {
		everyCheck = append(everyCheck, ch.name)
	}
	return []broken{
		{name: "DoubleExecution", new: mem(func(m *MemoryStore) idemstore.Store { return doubleExecution{m} }),
			fail: []string{"ClaimBusy", "ClaimConcurrent", "ReleaseByStranger", "TakeoverAfterLeaseExpiry", "Heartbeat", "UnclaimRefusesLateCopy"}},
		{name: "LostCompletion", new: mem(func(m *MemoryStore) idemstore.Store { return lostCompletion{m} }),
			fail: []string{"ClaimKeyedFingerprints", "CompleteAndReplay", "CompleteByStaleOwner", "CheckpointReplaces"}},
		{name: "StaleOwner", new: mem(func(m *MemoryStore) idemstore.Store { return staleOwner{m} }),
			fail: []string{"CompleteByStaleOwner", "ReleaseByStranger", "Heartbeat"}},
		{name: "StrangerRelease", new: mem(func(m *MemoryStore) idemstore.Store { return strangerRelease{m} }),
			fail: []string{"CompleteByStaleOwner", "ReleaseByStranger"}},
		{name: "IgnoredFingerprint", new: mem(func(m *MemoryStore) idemstore.Store { return ignoredFingerprint{m} }),
			fail: []string{"ClaimMismatch", "ClaimKeyedFingerprints"}},
		{name: "CompletedIgnoresFingerprint", new: mem(func(m *MemoryStore) idemstore.Store { return completedIgnoresFingerprint{m} }),
			fail: []string{"ClaimMismatch", "ClaimKeyedFingerprints"}},
		{name: "PlainFingerprints", new: mem(func(m *MemoryStore) idemstore.Store { return plainFingerprints{m} }),
			fail: []string{"ClaimKeyedFingerprints"}},
		{name: "FenceFromZero", new: mem(func(m *MemoryStore) idemstore.Store { return fenceFromZero{m} }),
			fail: []string{"ClaimAbsent", "ClaimRepeatedByOwner", "CompleteByStaleOwner", "ReleaseKeepsFenceAndCheckpoints", "TakeoverAfterLeaseExpiry", "UnclaimTakesFenceBack", "UnclaimRefusesLateCopy"}},
		{name: "FenceNotKept", new: mem(func(m *MemoryStore) idemstore.Store { return fenceNotKept{m} }),
			fail: []string{"CompleteByStaleOwner", "ReleaseKeepsFenceAndCheckpoints", "TakeoverAfterLeaseExpiry", "UnclaimTakesFenceBack"}},
		{name: "FenceCountsClaims", new: mem(func(m *MemoryStore) idemstore.Store {
			return &fenceCountsClaims{MemoryStore: m, claims: map[string]int64{}}
		}), fail: []string{"ClaimRepeatedByOwner", "UnclaimTakesFenceBack"}},
		{name: "BusyForever", new: mem(func(m *MemoryStore) idemstore.Store { return busyForever{m} }),
			fail: []string{"ClaimBusy"}},
		{name: "LostCheckpoints", new: mem(func(m *MemoryStore) idemstore.Store { return lostCheckpoints{m} }),
			fail: []string{"CompleteByStaleOwner", "ReleaseKeepsFenceAndCheckpoints", "TakeoverAfterLeaseExpiry", "CheckpointReplaces", "CheckpointBinary", "UnclaimTakesFenceBack"}},
		{name: "CheckpointAfterComplete", new: mem(func(m *MemoryStore) idemstore.Store { return checkpointAfterComplete{m} }),
			fail: []string{"CheckpointReplaces"}},
		{name: "SeparatorValues", new: mem(func(m *MemoryStore) idemstore.Store { return separatorValues{m} }),
			fail: []string{"CheckpointBinary"}},
		{name: "CStringPayloads", new: mem(func(m *MemoryStore) idemstore.Store { return cStringPayloads{m} }),
			fail: []string{"CompleteAndReplay"}},
		{name: "CompleteOnce", new: mem(func(m *MemoryStore) idemstore.Store { return completeOnce{m} }),
			fail: []string{"CompleteRepeatedByOwner"}},
		{name: "FixedRetention", new: mem(func(m *MemoryStore) idemstore.Store { return fixedRetention{m} }),
			fail: []string{"TTLs"}},
		{name: "LostHeartbeats", new: mem(func(m *MemoryStore) idemstore.Store { return lostHeartbeats{m} }),
			fail: []string{"CompleteByStaleOwner", "Heartbeat"}},
		{name: "ForgetfulRelease", new: mem(func(m *MemoryStore) idemstore.Store {
			return &forgetfulRelease{MemoryStore: m, renamed: map[string]string{}}
		}), fail: []string{"ReleaseKeepsFenceAndCheckpoints", "CheckpointReplaces", "CheckpointBinary", "WritesKeepTTL", "UnclaimTakesFenceBack"}},
		{name: "GrowingTTL", new: mem(func(m *MemoryStore) idemstore.Store { return &growingTTL{MemoryStore: m, writes: map[string]int{}} }),
			fail: []string{"WritesKeepTTL"}},
		{name: "DoubleLease", new: mem(func(m *MemoryStore) idemstore.Store { return doubleLease{m} }),
			fail: []string{"ClaimBusy", "CompleteByStaleOwner", "TakeoverAfterLeaseExpiry", "TTLs"}},
		// UnfinishedNeverExpire: a claim that writes its record without a TTL.
		{name: "UnfinishedNeverExpire", new: fix(func(r *idemstore.Record) {
			if r.State == idemstore.StateInProgress {
				r.TTL = 0
			}
		}), fail: []string{"TTLs", "WritesKeepTTL"}},
		{name: "NoLeaseSeen", new: fix(func(r *idemstore.Record) { r.LeaseTTL = 0 }),
			fail: []string{"TTLs"}},
		{name: "HourRecords", new: fix(func(r *idemstore.Record) { r.TTL = time.Hour }),
			fail: []string{"TTLs"}},
		{name: "EmptyRead", new: mem(func(m *MemoryStore) idemstore.Store { return emptyRead{m} }),
			fail: []string{"ReadAbsent", "UnclaimTakesFenceBack"}},
		{name: "Unavailable", new: func() (idemstore.Store, func(time.Duration)) { return unavailable{}, func(time.Duration) {} },
			fail: everyCheck[:len(everyCheck)-2], skip: unclaimChecks},
		// FrozenClock: leases that never expire, the harness's advance moving nothing.
		{name: "FrozenClock", new: func() (idemstore.Store, func(time.Duration)) { return NewMemoryStore(), func(time.Duration) {} },
			fail: []string{"CompleteByStaleOwner", "TakeoverAfterLeaseExpiry"}},
		// Correct stores: every check passes, or skips.
		{name: "CoarseClock", new: mem(func(m *MemoryStore) idemstore.Store { return coarseClock{m} })},
		{name: "WriteOnly", new: mem(func(m *MemoryStore) idemstore.Store { return writeOnly{m} }),
			skip: []string{"ClaimKeyedFingerprints", "CompleteAndReplay", "ReadAbsent", "TTLs", "WritesKeepTTL", "UnclaimTakesFenceBack", "UnclaimRefusesLateCopy"}},
	}
}

// TestBrokenStoresChild runs Run against every broken store; it fails, as
// it should, and runs only as the child of TestRunCatchesBrokenStores.
func TestBrokenStoresChild(t *testing.T) {
	if os.Getenv(brokenEnv) == "" {
		t.Skip("the child process of TestRunCatchesBrokenStores")
	}
	for _, b := range brokenStores() {
		t.Run(b.name, func(t *testing.T) {
			Run(t, Harness{New: func(*testing.T) (idemstore.Store, func(time.Duration)) { return b.new() }})
		})
	}
}

// outcome matches the result line of a check of a broken store.
var outcome = regexp.MustCompile(`--- (PASS|FAIL|SKIP): TestBrokenStoresChild/(\w+)/(\w+) `)

// TestRunCatchesBrokenStores checks the contract suite itself: against a
// store with a defect, the checks that verify the broken sentence fail and
// quote it, and the others pass.
func TestRunCatchesBrokenStores(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestBrokenStoresChild$", "-test.v", "-test.count=1", "-test.timeout=50s")
	cmd.Env = append(os.Environ(), brokenEnv+"=1")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("the checks of the broken stores did not end within a minute:\n%s", out)
	}
	if exit := (*exec.ExitError)(nil); !errors.As(err, &exit) {
		t.Fatalf("the checks of the broken stores: %v, want them to fail\n%s", err, out)
	}
	got, logs := map[string]string{}, map[string]string{}
	for line := range strings.Lines(string(out)) {
		if m := outcome.FindStringSubmatch(line); m != nil {
			got[m[2]+"/"+m[3]] = m[1]
		}
	}
	for _, part := range strings.Split(string(out), "=== RUN   TestBrokenStoresChild/")[1:] {
		name, log, _ := strings.Cut(part, "\n")
		logs[name] = log
	}
	for _, b := range brokenStores() {
		for _, ch := range checks {
			want := "PASS"
			switch {
			case slices.Contains(b.fail, ch.name):
				want = "FAIL"
			case slices.Contains(b.skip, ch.name):
				want = "SKIP"
			}
			name := b.name + "/" + ch.name
			if got[name] != want {
				t.Errorf("%s: %s, want %s\n%s", name, got[name], want, logs[name])
			} else if want == "FAIL" && !strings.Contains(logs[name], "contract: "+ch.contract) {
				t.Errorf("%s fails without quoting its contract, %q:\n%s", name, ch.contract, logs[name])
			}
		}
	}
	if t.Failed() {
		t.Logf("the child's output:\n%s", out)
	}
}
