package idem

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRetrySeconds: Retry-After in whole seconds, rounded up, at least 1.
func TestRetrySeconds(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "1", time.Millisecond: "1", time.Second: "1", 1001 * time.Millisecond: "2", 29*time.Second + 1: "30",
	} {
		require.Equal(t, want, retrySeconds(d), d.String())
	}
}
