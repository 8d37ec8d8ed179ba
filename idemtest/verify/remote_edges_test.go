package verify

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// post sends body to h's handler at path and returns the status.
func post(t *testing.T, hd http.Handler, method, path, body string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	hd.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
	return rec.Code, rec.Body.String()
}

// TestHandlerRefuses: Handler answers only POSTs of JSON to its paths, and
// records nothing for a call its History does not hold.
func TestHandlerRefuses(t *testing.T) {
	h := NewHistory()
	hd := Handler(h, NewSink(h))
	code, _ := post(t, hd, http.MethodGet, "/begin", `{"key":"k"}`)
	require.Equal(t, http.StatusBadRequest, code, "GET")
	code, _ = post(t, hd, http.MethodPost, "/begin", `{"key":`)
	require.Equal(t, http.StatusBadRequest, code, "not JSON")
	code, body := post(t, hd, http.MethodPost, "/ran", `{"id":0,"fence":1}`)
	require.Equal(t, http.StatusBadRequest, code, "no call yet")
	require.Contains(t, body, "unknown call")

	code, body = post(t, hd, http.MethodPost, "/begin", `{"key":"k","request":"r"}`)
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `{}`, body, "call 0")
	for _, id := range []string{"-1", "1"} {
		code, _ = post(t, hd, http.MethodPost, "/end", `{"id":`+id+`,"kind":"ok","value":"v"}`)
		require.Equal(t, http.StatusBadRequest, code, "call %s", id)
	}
	code, _ = post(t, hd, http.MethodPost, "/forget", `{"id":0}`)
	require.Equal(t, http.StatusNotFound, code)
	code, _ = post(t, hd, http.MethodPost, "/ran", `{"id":0,"fence":3}`)
	require.Equal(t, http.StatusOK, code)

	calls, _, _ := h.snapshot()
	require.Equal(t, []Call{{ID: 0, Key: "k", Request: "r", Start: calls[0].Start, End: -1, Ran: true, Fence: 3}}, calls)
	require.NoError(t, h.Err(), "a History of its own has no remote to fail")
}

// TestRemoteFailedBegin: a call whose start the server did not record
// records nothing afterwards, not even in another call, and its effect
// counts as refused; the calls recorded before go on as usual.
func TestRemoteFailedBegin(t *testing.T) {
	h := NewHistory()
	s := NewSink(h)
	var down atomic.Bool
	hd := Handler(h, s)
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(rw, "down", http.StatusServiceUnavailable)
			return
		}
		hd.ServeHTTP(rw, r)
	}))
	defer srv.Close()
	rh, rs := Remote(srv.URL + "/")

	first := rh.Begin("a", "r", false)
	second := rh.Begin("b", "r", false)
	require.Equal(t, []int{0, 1}, []int{first.ID(), second.ID()})
	down.Store(true)
	lost := rh.Begin("c", "r", false)
	down.Store(false)
	require.ErrorContains(t, rh.Err(), "503")
	lost.Ran(5)
	require.False(t, rs.Apply(lost, "c", 5, "c5"))
	lost.End("c5", nil)

	first.Ran(1)
	require.True(t, rs.Apply(first, "a", 1, "a1"), "call 0 offers its effect like any other")
	first.End("a1", nil)

	r := Check(h)
	require.True(t, r.OK(), "%v", r.Violations)
	require.Equal(t, 2, r.Operations)
	require.Equal(t, 1, r.Ran)
	require.Equal(t, 1, r.Unfinished, "the second call, which the failed one did not end")
	require.Equal(t, 1, r.Effects)
	calls, _, _ := h.snapshot()
	require.Equal(t, Call{ID: 1, Key: "b", Request: "r", Start: calls[1].Start, End: -1}, calls[1])
	require.Equal(t, "a1", calls[0].Result)
}
