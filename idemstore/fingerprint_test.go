package idemstore_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemstore"
)

// TestMatchFingerprint: the rule claim.lua applies in Lua, case by case.
func TestMatchFingerprint(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stored  string
		current string
		others  []string
		want    idemstore.ClaimStatus
	}{
		{"plain, the same", "sha", "sha", nil, idemstore.ClaimOK},
		{"plain, another", "sha1", "sha2", nil, idemstore.ClaimMismatch},
		{"keyed, the same", "k1.MAC", "k1.MAC", nil, idemstore.ClaimOK},
		{"keyed with the current key, another", "k1.MAC1", "k1.MAC2", nil, idemstore.ClaimMismatch},
		{"a key id with dots", "k.1.MAC1", "k.1.MAC2", nil, idemstore.ClaimMismatch},
		{"keyed with a listed key, the same", "k1.MAC1", "k2.MAC9", []string{"k3.MAC7", "k1.MAC1"}, idemstore.ClaimOK},
		{"keyed with a listed key, another", "k1.MAC1", "k2.MAC9", []string{"k3.MAC7", "k1.MAC2"}, idemstore.ClaimMismatch},
		{"keyed with a key not listed", "k1.MAC1", "k2.MAC9", []string{"k3.MAC7"}, idemstore.ClaimUnreadable},
		{"keyed, met by a plain request", "k1.MAC1", "sha", nil, idemstore.ClaimUnreadable},
		{"keyed, met by a plain request listing the key", "k1.MAC1", "sha", []string{"k1.MAC2"}, idemstore.ClaimMismatch},
		{"plain, met by a keyed request", "sha", "k1.MAC1", []string{"k2.MAC2"}, idemstore.ClaimUnreadable},
		{"plain, listed as it is", "sha", "k1.MAC1", []string{"sha"}, idemstore.ClaimUnreadable},
		{"empty key id, the current one", ".MAC1", ".MAC2", nil, idemstore.ClaimMismatch},
		{"empty key id, met by a plain request", ".MAC1", "sha", nil, idemstore.ClaimUnreadable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := idemstore.ClaimRequest{Fingerprint: tc.current, OtherFingerprints: tc.others}
			require.Equal(t, tc.want, c.MatchFingerprint(tc.stored))
		})
	}
}

// TestStatusNames: every outcome and state has its name; the zero value is
// neither.
func TestStatusNames(t *testing.T) {
	require.Equal(t, "unknown", idemstore.ClaimStatus(0).String())
	for s, name := range map[idemstore.ClaimStatus]string{
		idemstore.ClaimOK: "claimed", idemstore.ClaimCompleted: "completed", idemstore.ClaimBusy: "busy",
		idemstore.ClaimMismatch: "mismatch", idemstore.ClaimUnreadable: "unreadable",
	} {
		require.Equal(t, name, s.String())
	}
	require.Equal(t, "UNKNOWN", idemstore.State(0).String())
	require.Equal(t, "IN_PROGRESS", idemstore.StateInProgress.String())
	require.Equal(t, "COMPLETED", idemstore.StateCompleted.String())
}
