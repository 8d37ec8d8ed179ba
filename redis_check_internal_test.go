package idem

import (
	"context"
	"io"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestFailedToReach: Check ends on an error that is not the server's
// answer (the server could not be reached); a refusal is a finding.
func TestFailedToReach(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { _ = c.Close() })
	refusal := c.Do(context.Background(), "NOSUCHCOMMAND").Err()
	require.Error(t, refusal)
	require.NoError(t, failedToReach(refusal))
	require.NoError(t, failedToReach(nil))
	require.ErrorIs(t, failedToReach(io.ErrUnexpectedEOF), io.ErrUnexpectedEOF)
}
