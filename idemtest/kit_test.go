package idemtest_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/idemtest"
)

func claimReq(owner, fp string) idemstore.ClaimRequest {
	return idemstore.ClaimRequest{Owner: owner, Fingerprint: fp, Lease: time.Minute, TTL: time.Hour}
}

// A fence below 1 counts as 1: the first run is then attempt 1, as on the
// store itself.
func TestAsAttemptFenceBelowOne(t *testing.T) {
	for _, fence := range []int64{-3, 0, 1, 4} {
		res, err := idemtest.AsAttempt(idemtest.NewMemoryStore(), fence, nil).Claim(t.Context(), "id", claimReq("o", "fp"))
		require.NoError(t, err)
		require.Equal(t, max(fence, 1), res.Fence, "first run with fence %d", fence)
	}
}

// Only claims that grant the operation are shifted: a replay, a busy key, a
// mismatch and an error are the store's own.
func TestAsAttemptShiftsGrantedClaimsOnly(t *testing.T) {
	ctx := t.Context()
	s := idemtest.NewMemoryStore()
	a := idemtest.AsAttempt(s, 5, map[string][]byte{"x": []byte("earlier")})
	res, err := a.Claim(ctx, "id", claimReq("o1", "fp"))
	require.NoError(t, err)
	require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimOK, Fence: 5, Checkpoints: map[string][]byte{"x": []byte("earlier")}}, res)

	res, err = a.Claim(ctx, "id", claimReq("o2", "fp"))
	require.NoError(t, err)
	require.Equal(t, idemstore.ClaimBusy, res.Status)
	require.Zero(t, res.Fence)
	require.Nil(t, res.Checkpoints)

	require.NoError(t, a.Complete(ctx, "id", "o1", []byte("done"), time.Hour))
	res, err = a.Claim(ctx, "id", claimReq("o3", "fp"))
	require.NoError(t, err)
	require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimCompleted, Fence: 1, Payload: []byte("done")}, res)
	res, err = a.Claim(ctx, "id", claimReq("o4", "other"))
	require.NoError(t, err)
	require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimMismatch, Fence: 1}, res)

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	res, err = a.Claim(canceled, "id2", claimReq("o5", "fp"))
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, res)
}

// Without checkpoints of its own, AsAttempt hands out the store's.
func TestAsAttemptKeepsTheStoresCheckpoints(t *testing.T) {
	ctx := t.Context()
	a := idemtest.AsAttempt(idemtest.NewMemoryStore(), 2, nil)
	_, err := a.Claim(ctx, "id", claimReq("o1", "fp"))
	require.NoError(t, err)
	require.NoError(t, a.Checkpoint(ctx, "id", "o1", "step", []byte("1")))
	require.NoError(t, a.Release(ctx, "id", "o1"))
	res, err := a.Claim(ctx, "id", claimReq("o2", "fp"))
	require.NoError(t, err)
	require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimOK, Fence: 3, Checkpoints: map[string][]byte{"step": []byte("1")}}, res)
}

// Advance never moves the clock back: a negative d changes nothing.
func TestMemoryStoreAdvanceForwardOnly(t *testing.T) {
	ctx := t.Context()
	s := idemtest.NewMemoryStore()
	_, err := s.Claim(ctx, "id", claimReq("o", "fp"))
	require.NoError(t, err)
	s.Advance(-2 * time.Hour)
	rec, err := s.Read(ctx, "id")
	require.NoError(t, err)
	require.NotNil(t, rec, "a step back must not expire the record")
	require.LessOrEqual(t, rec.TTL, time.Hour)
	require.LessOrEqual(t, rec.LeaseTTL, time.Minute)
}

// A lease can outlive its record (a TTL shorter than the lease): the key
// stays busy until the lease ends, then starts again at fence 1.
func TestMemoryStoreLeaseOutlivesRecord(t *testing.T) {
	ctx := t.Context()
	s := idemtest.NewMemoryStore()
	short := idemstore.ClaimRequest{Owner: "o1", Fingerprint: "fp", Lease: time.Minute, TTL: time.Second}
	_, err := s.Claim(ctx, "id", short)
	require.NoError(t, err)
	s.Advance(2 * time.Second)
	res, err := s.Claim(ctx, "id", claimReq("o2", "fp"))
	require.NoError(t, err)
	require.Equal(t, idemstore.ClaimBusy, res.Status)
	require.Greater(t, res.RetryAfter, 50*time.Second)
	s.Advance(time.Minute)
	res, err = s.Claim(ctx, "id", claimReq("o2", "fp"))
	require.NoError(t, err)
	require.Equal(t, idemstore.ClaimOK, res.Status)
	require.Equal(t, int64(1), res.Fence)
}

// Every copy Parallel sends carries the request's body, and the request keeps
// it.
func TestParallelCopiesTheBody(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []string
	)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%s/%d", b, r.ContentLength))
		mu.Unlock()
	})
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("payload"))
	res := idemtest.Parallel(3, r, func(h http.Handler) http.Handler { return h }, h)
	require.Equal(t, 3, res.Ran)
	require.Equal(t, []string{"payload/7", "payload/7", "payload/7"}, seen)
	b, err := io.ReadAll(r.Body)
	require.NoError(t, err)
	require.Equal(t, "payload", string(b), "the request's body is still there")
}

// A copy that panics after writing keeps what it wrote; one that panics
// before gets 500.
func TestParallelPanicAfterWriting(t *testing.T) {
	none := func(h http.Handler) http.Handler { return h }
	tests := []struct {
		name   string
		h      http.HandlerFunc
		status int
	}{
		{"a body", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusAccepted)
			_, _ = w.Write([]byte("partial"))
			panic("boom")
		}, http.StatusAccepted},
		{"a flush", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusAccepted)
			w.(http.Flusher).Flush()
			panic("boom")
		}, http.StatusAccepted},
		{"nothing", func(http.ResponseWriter, *http.Request) { panic("boom") }, http.StatusInternalServerError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := idemtest.Parallel(2, httptest.NewRequest(http.MethodGet, "/", nil), none, tt.h)
			require.Equal(t, map[int]int{tt.status: 2}, res.Statuses)
			require.Equal(t, []any{"boom", "boom"}, res.Panics)
		})
	}
}

// A heartbeat of a key nobody holds is ErrLeaseLost, whatever its owner,
// the empty one included, as on Redis: it never creates a lease.
func TestMemoryStoreHeartbeatWithoutLease(t *testing.T) {
	ctx := t.Context()
	s := idemtest.NewMemoryStore()
	for _, owner := range []string{"o1", ""} {
		require.ErrorIs(t, s.Heartbeat(ctx, "id", owner, time.Minute), idem.ErrLeaseLost, "owner %q", owner)
	}
	res, err := s.Claim(ctx, "id", claimReq("o2", "fp"))
	require.NoError(t, err)
	require.Equal(t, idemstore.ClaimOK, res.Status, "the key is free")
	require.ErrorIs(t, s.Heartbeat(ctx, "id", "", time.Minute), idem.ErrLeaseLost, "the empty owner is nobody")
}
