package idemtest

import (
	"context"
	"maps"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// NewGuard returns a Guard on a fresh MemoryStore: idem in one call for a
// unit test, without Redis. Each call has a store of its own, so tests do not
// see each other's keys.
func NewGuard(opts ...idem.Option) *idem.Guard {
	return idem.New(NewMemoryStore(), opts...)
}

// NewAttemptGuard returns a Guard on a fresh MemoryStore whose first run of
// every key is attempt number fence, seeing checkpoints, as if fence-1
// earlier attempts had started and died: the branch of a function that
// reconciles (Attempt.Fence > 1), tested without crashing anything. It is
// AsAttempt on a MemoryStore.
func NewAttemptGuard(fence int64, checkpoints map[string][]byte, opts ...idem.Option) *idem.Guard {
	return idem.New(AsAttempt(NewMemoryStore(), fence, checkpoints), opts...)
}

// AsAttempt returns a store over s whose claims report an attempt fence-1
// later than s does, with checkpoints added to those s holds (which replace
// any of the same name, as later attempts' do). The first run of a key is
// then attempt number fence, seeing checkpoints, as if earlier attempts had
// started and not completed; a re-run after a release is fence+1. Replays
// and every other store method are s's own. A fence below 1 counts as 1.
//
// Use it to run a Do function, a Once function or a handler under
// Guard.Middleware as attempt N:
//
//	g := idem.New(idemtest.AsAttempt(store, 2, map[string][]byte{"charge_id": []byte("ch_1")}))
//
// The returned store does not implement idemstore.Reader; read s instead.
// Its checkpoints are handed out as given, unsealed: under a Guard with
// idem.WithSealer they do not open (idem.ErrUnreadable), so test the
// reconciling branch on a Guard without a Sealer.
func AsAttempt(s idemstore.Store, fence int64, checkpoints map[string][]byte) idemstore.Store {
	return &attemptStore{Store: s, earlier: max(fence, 1) - 1, checkpoints: cloneMap(checkpoints)}
}

// attemptStore is the store AsAttempt returns.
type attemptStore struct {
	idemstore.Store
	earlier     int64             // attempts before the first run
	checkpoints map[string][]byte // what they left
}

// Claim implements idemstore.Store.
func (a *attemptStore) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	res, err := a.Store.Claim(ctx, id, c)
	if err != nil || res.Status != idemstore.ClaimOK {
		return res, err
	}
	res.Fence += a.earlier
	if len(a.checkpoints) > 0 {
		cps := cloneMap(a.checkpoints)
		maps.Copy(cps, res.Checkpoints)
		res.Checkpoints = cps
	}
	return res, nil
}
