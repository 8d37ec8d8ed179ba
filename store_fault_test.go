package idem_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
)

func (s *faultyStore) Checkpoint(ctx context.Context, id, owner, name string, value []byte) error {
	if err := s.fail["Checkpoint"]; err != nil {
		return err
	}
	return s.Store.Checkpoint(ctx, id, owner, name, value)
}

// TestCheckpointStoreFails: a checkpoint the store fails to write is
// ErrStoreUnavailable, wrapping the store's error; when fn's context ended
// first, it is the context's cause instead, since the store's error may only
// be the end of that context.
func TestCheckpointStoreFails(t *testing.T) {
	down := errors.New("connection reset")
	g := idem.New(&faultyStore{Store: idemtest.NewMemoryStore(), fail: map[string]error{"Checkpoint": down}})
	stop := errors.New("shutting down")
	var live, ended error
	_, err := idem.Do(context.Background(), g, "k", struct{}{}, func(ctx context.Context, a *idem.Attempt) (string, error) {
		live = a.Checkpoint(ctx, "charge", []byte("ch_1"))
		cctx, cancel := context.WithCancelCause(ctx)
		cancel(stop)
		ended = a.Checkpoint(cctx, "charge", []byte("ch_1"))
		return "v", nil
	})
	require.NoError(t, err)
	require.ErrorIs(t, live, idem.ErrStoreUnavailable)
	require.ErrorIs(t, live, down)
	require.ErrorIs(t, ended, stop)
	require.NotErrorIs(t, ended, idem.ErrStoreUnavailable)
}

// TestOncePermanentNotRecorded: a Permanent error whose record the store
// fails to write reaches the caller with ErrNotRecorded beside it, fn's
// error first.
func TestOncePermanentNotRecorded(t *testing.T) {
	down := errors.New("connection reset")
	g := idem.New(&faultyStore{Store: idemtest.NewMemoryStore(), fail: map[string]error{"Complete": down}})
	boom := errors.New("card declined")
	ran, err := g.Once(context.Background(), "m1", func(ctx context.Context) error { return idem.Permanent(boom) })
	require.True(t, ran)
	require.ErrorIs(t, err, boom)
	require.ErrorIs(t, err, idem.ErrPermanent)
	require.ErrorIs(t, err, idem.ErrNotRecorded)
	require.ErrorIs(t, err, down)
}
