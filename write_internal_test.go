package idem

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemstore"
)

// TestBoundedInlineWrite: a store that returns by its context's deadline is
// called inline; its error is reported as a write timeout when the deadline
// passed, and as it is otherwise.
func TestBoundedInlineWrite(t *testing.T) {
	g := &Guard{write: 20 * time.Millisecond, inlineWrites: true}
	boom := errors.New("boom")

	err := g.bounded(context.Background(), func(ctx context.Context) error { return boom })
	require.ErrorIs(t, err, boom)
	require.NotErrorIs(t, err, errWriteTimeout, "an error before the deadline is the store's own")

	err = g.bounded(context.Background(), func(ctx context.Context) error {
		<-ctx.Done() // the write's deadline, 20ms away
		return ctx.Err()
	})
	require.ErrorIs(t, err, errWriteTimeout)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	require.NoError(t, g.bounded(context.Background(), func(ctx context.Context) error { return nil }))
}

// TestBoundedWriteDetached: the write outlives the caller's context, and a
// store that ignores its deadline is left behind with errWriteTimeout.
func TestBoundedWriteDetached(t *testing.T) {
	g := &Guard{write: 20 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	boom := errors.New("boom")
	seen := make(chan error, 1)
	require.ErrorIs(t, g.bounded(ctx, func(wctx context.Context) error {
		seen <- wctx.Err()
		return boom
	}), boom)
	require.NoError(t, <-seen, "the caller's cancellation reached the write")

	stuck := make(chan struct{})
	defer close(stuck)
	require.Equal(t, errWriteTimeout, g.bounded(context.Background(), func(context.Context) error {
		<-stuck // a store that ignores its context
		return nil
	}))
}

// releaseStore is a store whose Release answers err.
type releaseStore struct {
	idemstore.Store
	err error
}

func (s releaseStore) Release(context.Context, string, string) error { return s.err }

// TestReleaseFailureLogged: a release the store refuses is logged, as the
// key then stays claimed until its lease expires; a release that worked, or
// found the lease already lost, logs nothing.
func TestReleaseFailureLogged(t *testing.T) {
	for name, c := range map[string]struct {
		err    error
		logged bool
	}{
		"released":   {nil, false},
		"lease lost": {ErrLeaseLost, false},
		"refused":    {errors.New("boom"), true},
	} {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			g := &Guard{
				store: releaseStore{err: c.err}, write: time.Second, budget: time.Second, inlineWrites: true,
				log: slog.New(slog.NewTextHandler(&buf, nil)), health: newStoreHealth(),
			}
			g.release(context.Background(), "id", "owner", time.Now())
			require.NoError(t, g.Drain(t.Context()))
			if !c.logged {
				require.Empty(t, buf.String())
				return
			}
			require.Contains(t, buf.String(), "event=release_failed")
			require.Contains(t, buf.String(), "boom")
		})
	}
}
