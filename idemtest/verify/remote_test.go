package verify

import (
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestRemote: calls and effects recorded through Remote land in the
// server's History and Sink, whose fence check applies to every client;
// a call whose client never ends it stays unfinished.
func TestRemote(t *testing.T) {
	h := NewHistory()
	s := NewSink(h)
	srv := httptest.NewServer(Handler(h, s))
	defer srv.Close()
	h1, s1 := Remote(srv.URL)
	h2, s2 := Remote(srv.URL)

	stale := h1.Begin("k", "r", false)
	stale.Ran(1)
	taker := h2.begin("k", "r", false, "http")
	taker.Ran(2)
	_, found := s2.Lookup("k", 2)
	require.False(t, found)
	require.True(t, s2.Apply(taker, "k", 2, "v2"))
	taker.End("v2", nil)
	require.False(t, s1.Apply(stale, "k", 1, "v1"), "a fence below the highest seen by another process is refused")
	v, found := s1.Lookup("k", 2)
	require.True(t, found)
	require.Equal(t, "v2", v)
	stale.End("", errors.Join(idem.ErrNotRecorded, idem.ErrLeaseLost))
	perm := h1.Begin("p", "r", false)
	perm.End("", idem.Permanent(errors.New("declined")))
	killed := h2.Begin("q", "r", false)
	killed.Ran(1)
	require.NoError(t, h1.Err())
	require.NoError(t, h2.Err())

	calls, effects := h1.Len()
	require.Zero(t, calls+effects, "a remote History holds nothing itself")
	r := Check(h)
	require.True(t, r.OK(), "%v", r.Violations)
	require.Equal(t, 4, r.Operations)
	require.Equal(t, 2, r.Effects)
	require.Equal(t, 1, r.Fenced)
	require.Equal(t, 1, r.Unfinished)
	require.Equal(t, 1, r.Errors[KindNotRecordedLeaseLost])
	require.Equal(t, 1, r.Errors[KindPermanent])
	cs, _, _ := h.snapshot()
	require.Equal(t, "http", cs[1].Via)
	require.Equal(t, "declined", cs[2].Result)
	require.Equal(t, []string{"k", "p", "q"}, h.Keys())

	srv.Close()
	h1.Begin("z", "r", false).End("z", nil)
	require.Error(t, h1.Err(), "a failed request is reported")
}
