// The workload's parts, one by one. This file sorts first so that TestPad,
// which bounds its wait, runs before any test that pads results in a run.

package verify

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// bounded runs f and fails the test when it has not returned within d.
func bounded(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
	}
}

// TestPad: a result is Payload bytes, the value then '|' then filler
// derived from the value (or just the value and '|' when it is longer);
// unpad gives the value back and marks anything else as corrupt.
func TestPad(t *testing.T) {
	bounded(t, 10*time.Second, "pad", func() {
		w := &Workload{Payload: 200}
		r := w.pad("k1/2/3")
		require.Len(t, r, 200)
		require.True(t, strings.HasPrefix(r, "k1/2/3|"), r)
		require.NotEqual(t, r, w.pad("k1/2/4"), "the filler depends on the value")
		require.Equal(t, "k1/2/3", w.unpad(r))

		tampered := r[:100] + "x" + r[101:]
		require.Equal(t, "corrupt:"+tampered[:64], w.unpad(tampered))
		require.Equal(t, "corrupt:no bar", w.unpad("no bar"))

		w.Payload = 4
		require.Equal(t, "k1/2/3|", w.pad("k1/2/3"), "a value longer than Payload")
		require.Equal(t, "k1/2/3", w.unpad("k1/2/3|"))
		w.Payload = 7
		require.Equal(t, "k1/2/3|", w.pad("k1/2/3"), "exactly Payload")
	})
}

// TestWorkloadDefaults: zero fields get their documented defaults; set
// ones are kept.
func TestWorkloadDefaults(t *testing.T) {
	w := &Workload{}
	w.defaults()
	require.Equal(t, 16, w.Workers)
	require.Equal(t, 1000, w.Keys)
	require.Equal(t, 64, w.Payload)
	require.Equal(t, 2*time.Millisecond, w.Work)
	require.Equal(t, 256, cap(w.retries))

	w = &Workload{Workers: 1, Keys: 1, Payload: 1, Work: time.Nanosecond}
	w.defaults()
	require.Equal(t, []any{1, 1, 1, time.Nanosecond}, []any{w.Workers, w.Keys, w.Payload, w.Work})
}

// TestPickKeys: keys are KeyPrefix and a number below Keys, new ones in
// order while some remain, and never more than Keys distinct ones.
func TestPickKeys(t *testing.T) {
	w := &Workload{Keys: 3, KeyPrefix: "p"}
	w.defaults()
	rnd := rand.New(rand.NewPCG(1, 2))
	var order []string
	seen := map[string]bool{}
	for range 200 {
		k, _ := w.pick(rnd)
		if !seen[k] {
			seen[k] = true
			order = append(order, k)
		}
	}
	require.Equal(t, []string{"p0", "p1", "p2"}, order)
	require.Equal(t, 3, w.KeysUsed())
}

// TestVia: the names of the entry points, and which one a key takes.
func TestVia(t *testing.T) {
	require.Equal(t, []string{"do", "http", "once", "all", "via(7)"},
		[]string{ViaDo.String(), ViaHTTP.String(), ViaOnce.String(), ViaAll.String(), Via(7).String()})
	w := &Workload{KeyPrefix: "k", Via: ViaHTTP}
	require.Equal(t, ViaHTTP, w.viaOf("k4"))
	w.Via = ViaAll
	var got []Via
	for n := range 6 {
		got = append(got, w.viaOf(fmt.Sprint("k", n)))
	}
	require.Equal(t, []Via{ViaDo, ViaHTTP, ViaOnce, ViaDo, ViaHTTP, ViaOnce}, got)
}

// TestWebOutcome: a call through the middleware is classified by the
// engine's error when the Observer saw one, else by its response.
func TestWebOutcome(t *testing.T) {
	kind := func(ev *idem.Event, code int, text string, err error) string {
		k, v := webOutcome(ev, code, text, err)
		return string(k) + ":" + v
	}
	require.Equal(t, "not_recorded:", kind(&idem.Event{Err: errors.Join(idem.ErrNotRecorded, idem.ErrStoreUnavailable)}, 200, "v", nil))
	require.Equal(t, "ok:v", kind(&idem.Event{}, 200, "v", nil), "an event without an error")
	require.Equal(t, "canceled:", kind(nil, 0, "", fmt.Errorf("post: %w", context.Canceled)))
	require.Equal(t, "canceled:", kind(nil, 0, "", context.DeadlineExceeded))
	require.Equal(t, "failed:", kind(nil, 0, "", errors.New("connection reset")))
	for code, want := range map[int]string{
		http.StatusOK:                  "ok:text",
		http.StatusPaymentRequired:     "permanent:text",
		http.StatusConflict:            "in_progress:",
		http.StatusUnprocessableEntity: "mismatch:",
		http.StatusBadRequest:          "invalid_key:",
		http.StatusServiceUnavailable:  "store_unavailable:",
		http.StatusInternalServerError: "failed:",
	} {
		require.Equal(t, want, kind(nil, code, "text", nil), "%d", code)
	}
}

// TestServeCallWithoutCall: the handler under the middleware refuses a
// request that is not one of the Workload's calls.
func TestServeCallWithoutCall(t *testing.T) {
	rec := httptest.NewRecorder()
	serveCall(rec, httptest.NewRequest(http.MethodPost, "/pay", nil))
	require.Equal(t, http.StatusInternalServerError, rec.Code)
}

// TestFn: the function acts on the sink once at fence 1 and returns the
// effect's value; a takeover (Fence > 1), and every run under Once (no
// Attempt), reconcile with the effect the sink accepted instead of acting
// again; now and then it fails, transiently or permanently.
func TestFn(t *testing.T) {
	var acted, again, transient, permanent int
	for seed := range uint64(100) {
		h := NewHistory()
		s := NewSink(h)
		w := &Workload{Payload: 80, Work: time.Nanosecond}
		w.defaults()
		var ran []string
		w.OnRun = func(_ context.Context, key string, a *idem.Attempt) {
			ran = append(ran, fmt.Sprintf("%s %v", key, a != nil))
		}
		rnd := rand.New(rand.NewPCG(seed, 1))
		op := h.Begin("k", "pay", false)
		v, err := w.fn(context.Background(), rnd, op, s, "k", &idem.Attempt{Key: "k", ID: "id", Fence: 1})
		switch {
		case errors.Is(err, errTransient):
			transient++
			continue
		case errors.Is(err, idem.ErrPermanent):
			permanent++
			require.ErrorContains(t, err, "verify: declined k")
			continue
		}
		require.NoError(t, err)
		acted++
		require.Equal(t, w.pad("k/1/0"), v)
		got, ok := s.Lookup("k", 0)
		require.True(t, ok)
		require.Equal(t, "k/1/0", got)

		// Fence 1 again: Redis lost the record, and the function acts
		// again, as it would in production (the check's I1 sees it).
		latest, want := "k/1/0", 1
		v, err = w.fn(context.Background(), rand.New(rand.NewPCG(seed, 3)), h.Begin("k", "pay", false), s, "k", &idem.Attempt{Key: "k", ID: "id", Fence: 1})
		if err == nil {
			again++
			latest, want = "k/1/1", 2
			require.Equal(t, w.pad(latest), v)
		}
		for _, a := range []*idem.Attempt{{Key: "k", ID: "id", Fence: 2}, nil} {
			op := h.Begin("k", "pay", false)
			v, err = w.fn(context.Background(), rand.New(rand.NewPCG(seed, 2)), op, s, "k", a)
			require.NoError(t, err)
			require.Equal(t, w.pad(latest), v, "reconciled with the effect accepted last")
		}
		calls, effects, _ := h.snapshot()
		require.Len(t, effects, want, "no effect from a reconciliation")
		require.Equal(t, []int64{1, 1, 2, 0}, []int64{calls[0].Fence, calls[1].Fence, calls[2].Fence, calls[3].Fence})
		for _, c := range calls {
			require.True(t, c.Ran)
		}
		require.Equal(t, []string{"k true", "k true", "k true", "k false"}, ran)
	}
	require.Greater(t, again, 60)
	require.Positive(t, transient)
	require.Positive(t, permanent)
	require.Greater(t, acted, 80)
}
