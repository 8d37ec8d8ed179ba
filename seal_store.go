package idem

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// sealedStore is the store of a Guard with a Sealer: it seals what goes to
// the store, opens what comes back, and keys the fingerprints of claims. The
// engine sees plaintext only. New puts it in front of the Guard's store.
type sealedStore struct {
	idemstore.Store // Heartbeat and Release pass through
	sealer          Sealer
	log             *slog.Logger
	fkeys           []*fingerprintKey // the current key first; none: plain fingerprints
	bad             error             // a FingerprintKeyer that gave unusable keys
	// releaseTimeout bounds the release of a claim whose checkpoints do
	// not open.
	releaseTimeout time.Duration
}

// ReturnsByDeadline reports what the wrapped store does.
func (s *sealedStore) ReturnsByDeadline() bool {
	d, ok := s.Store.(idemstore.DeadlineAware)
	return ok && d.ReturnsByDeadline()
}

// storeHealth returns the wrapped store's fail-fast state, if it keeps one.
func (s *sealedStore) storeHealth() *storeHealth {
	if h, ok := s.Store.(healthStore); ok {
		return h.storeHealth()
	}
	return nil
}

// Unclaim takes a claim back where the wrapped store can
// (idemstore.Unclaimer), else releases it.
func (s *sealedStore) Unclaim(ctx context.Context, id, owner string, lease time.Duration) error {
	if u, ok := s.Store.(idemstore.Unclaimer); ok {
		return u.Unclaim(ctx, id, owner, lease)
	}
	return s.Store.Release(ctx, id, owner)
}

// fingerprintKey keys fingerprints under one key id.
type fingerprintKey struct {
	id   string
	macs pool[hash.Hash] // HMAC-SHA-256 under the key's secret
}

// newSealedStore returns st sealed by s, logging to log; a release it makes
// itself waits at most releaseTimeout.
func newSealedStore(st idemstore.Store, s Sealer, log *slog.Logger, releaseTimeout time.Duration) *sealedStore {
	ss := &sealedStore{Store: st, sealer: s, log: log, releaseTimeout: releaseTimeout}
	fk, ok := s.(idemstore.FingerprintKeyer)
	if !ok {
		return ss
	}
	current, secrets := fk.FingerprintKeys()
	if _, ok := secrets[current]; !ok {
		ss.bad = fmt.Errorf("%w: WithSealer: the Sealer's current fingerprint key %q is not among its keys", ErrStoreUnavailable, current)
		return ss
	}
	ids := slices.Sorted(maps.Keys(secrets))
	slices.SortStableFunc(ids, func(a, b string) int { // the current key first
		switch {
		case a == current:
			return -1
		case b == current:
			return 1
		}
		return 0
	})
	for _, id := range ids {
		secret := slices.Clone(secrets[id])
		switch {
		case validKeyID(id) != nil:
			ss.bad = fmt.Errorf("%w: WithSealer: the Sealer's fingerprint keys: %w", ErrStoreUnavailable, validKeyID(id))
			return ss
		case len(secret) < minFingerprintSecret:
			ss.bad = fmt.Errorf("%w: WithSealer: the Sealer's fingerprint secret %q is shorter than %d bytes", ErrStoreUnavailable, id, minFingerprintSecret)
			return ss
		}
		k := &fingerprintKey{id: id}
		k.macs.fresh = func() hash.Hash { return hmac.New(sha256.New, secret) }
		ss.fkeys = append(ss.fkeys, k)
	}
	return ss
}

// keyed returns fp keyed under k: KEYID.MAC, MAC the first 128 bits of
// HMAC-SHA-256(secret, fp), base64url encoded.
func (k *fingerprintKey) keyed(fp string) string {
	mac := k.macs.get()
	mac.Reset()
	mac.Write([]byte(fp))
	var sum [sha256.Size]byte
	out := make([]byte, 0, len(k.id)+1+base64.RawURLEncoding.EncodedLen(16))
	out = append(append(out, k.id...), '.')
	out = base64.RawURLEncoding.AppendEncode(out, mac.Sum(sum[:0])[:16])
	k.macs.put(mac)
	return string(out)
}

// keyIDs returns the ids of the fingerprint keys, the current one first.
func (s *sealedStore) keyIDs() []string {
	ids := make([]string, len(s.fkeys))
	for i, k := range s.fkeys {
		ids[i] = k.id
	}
	return ids
}

// Claim implements Store: it keys the fingerprint under every listed key,
// and opens a completed record's payload or the checkpoints it returns.
// Checkpoints that do not open release the claim again.
func (s *sealedStore) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	if s.bad != nil {
		return idemstore.ClaimResult{}, s.bad
	}
	if len(s.fkeys) > 0 {
		plain := c.Fingerprint
		c.Fingerprint = s.fkeys[0].keyed(plain)
		if len(s.fkeys) > 1 {
			c.OtherFingerprints = make([]string, 0, len(s.fkeys)-1)
			for _, k := range s.fkeys[1:] {
				c.OtherFingerprints = append(c.OtherFingerprints, k.keyed(plain))
			}
		}
	}
	res, err := s.Store.Claim(ctx, id, c)
	if err != nil {
		return res, err
	}
	switch {
	case res.Status == idemstore.ClaimCompleted:
		if res.Payload, err = s.open(ctx, id, "result", res.Payload, resultBinding(id)); err != nil {
			return idemstore.ClaimResult{}, err
		}
	case res.Status == idemstore.ClaimOK && len(res.Checkpoints) > 0:
		cps := make(map[string][]byte, len(res.Checkpoints))
		for name, v := range res.Checkpoints {
			if cps[name], err = s.open(ctx, id, "checkpoint "+name, v, checkpointBinding(id, name)); err != nil {
				s.release(ctx, id, c.Owner)
				return idemstore.ClaimResult{}, err
			}
		}
		res.Checkpoints = cps
	}
	return res, nil
}

// release gives up a claim whose checkpoints do not open, so that the key
// is not held for a lease by an attempt that never runs.
func (s *sealedStore) release(ctx context.Context, id, owner string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.releaseTimeout)
	defer cancel()
	if err := s.Store.Release(rctx, id, owner); err != nil && !errors.Is(err, ErrLeaseLost) {
		s.log.WarnContext(ctx, "idem: release failed; the key stays claimed until its lease expires", "event", "release_failed", "id", id, "err", err)
	}
}

// Checkpoint implements Store: it seals value for the checkpoint's slot.
func (s *sealedStore) Checkpoint(ctx context.Context, id, owner, name string, value []byte) error {
	sealed, err := s.sealer.Seal(value, checkpointBinding(id, name))
	if err != nil {
		return fmt.Errorf("idem: sealing checkpoint %q: %w", name, err)
	}
	return s.Store.Checkpoint(ctx, id, owner, name, sealed)
}

// Complete implements Store: it seals the payload for the result's slot.
func (s *sealedStore) Complete(ctx context.Context, id, owner string, payload []byte, retention time.Duration) error {
	sealed, err := s.sealer.Seal(payload, resultBinding(id))
	if err != nil {
		return fmt.Errorf("idem: sealing the result: %w", err)
	}
	return s.Store.Complete(ctx, id, owner, sealed, retention)
}

// errNoWatch is Watch's answer when the sealed store cannot watch.
var errNoWatch = errors.New("idem: the store cannot watch operations")

// Watch implements idemstore.Watcher when the sealed store does.
func (s *sealedStore) Watch(ctx context.Context, id string) (<-chan struct{}, func(), error) {
	if w, ok := s.Store.(idemstore.Watcher); ok {
		return w.Watch(ctx, id)
	}
	return nil, nil, errNoWatch
}

// open opens a sealed value read back from the store. A value that does not
// open is logged at error level, with its key id when it has one, and
// reported as ErrUnreadable.
func (s *sealedStore) open(ctx context.Context, id, slot string, sealed, binding []byte) ([]byte, error) {
	p, err := s.sealer.Open(sealed, binding)
	if err == nil {
		return p, nil
	}
	_, kid, _ := splitSealed(sealed)
	s.log.ErrorContext(ctx, "idem: stored value does not open; the operation is refused and not run again",
		"event", "stored_value_unreadable", "id", id, "slot", slot, "key", kid, "err", err)
	if !errors.Is(err, ErrUnreadable) {
		err = fmt.Errorf("%w: %w", ErrUnreadable, err)
	}
	return nil, err
}

// resultBinding is the binding of an operation's result or response.
func resultBinding(id string) []byte {
	return append(append(make([]byte, 0, len(id)+7), id...), "\x00result"...)
}

// checkpointBinding is the binding of one of an operation's checkpoints.
func checkpointBinding(id, name string) []byte {
	b := make([]byte, 0, len(id)+4+len(name))
	return append(append(append(b, id...), "\x00cp\x00"...), name...)
}
