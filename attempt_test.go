package idem_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestAttemptNotFromIdem: an Attempt idem did not create (a zero value, or
// nil) gives an error from Checkpoint and no checkpoints, never a panic.
func TestAttemptNotFromIdem(t *testing.T) {
	var zero idem.Attempt
	require.ErrorContains(t, zero.Checkpoint(context.Background(), "n", []byte("v")), "did not create")
	require.Empty(t, zero.Checkpoints())
	var nilAttempt *idem.Attempt
	require.ErrorContains(t, nilAttempt.Checkpoint(context.Background(), "n", nil), "did not create")
	require.Empty(t, nilAttempt.Checkpoints())
}
