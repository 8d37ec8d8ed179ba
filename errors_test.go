package idem_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// TestStoreErrorsHaveOneValue proves that the errors a store returns are
// the ones callers test for: errors.Is matches either name, both ways.
func TestStoreErrorsHaveOneValue(t *testing.T) {
	for _, tc := range []struct {
		name       string
		root, from error
	}{
		{name: "lease lost", root: idem.ErrLeaseLost, from: idemstore.ErrLeaseLost},
		{name: "store unavailable", root: idem.ErrStoreUnavailable, from: idemstore.ErrStoreUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorIs(t, fmt.Errorf("wrapped: %w", tc.from), tc.root)
			require.ErrorIs(t, fmt.Errorf("wrapped: %w", tc.root), tc.from)
			require.True(t, errors.Is(tc.root, tc.from))
		})
	}
}
