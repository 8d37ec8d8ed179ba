package idem

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/idemkit/idem/idemstore"
)

// A Sealer protects what a Guard stores: Do and Once results (a Permanent
// error's message among them), HTTP responses (status, stored headers and
// body) and checkpoint values are sealed before they leave the process and
// opened when read back. binding ties a sealed value to the operation, and
// the slot within it, that it was written for: Open must fail unless given
// the binding Seal was given, so that a value copied onto another
// operation's record, or onto another checkpoint, does not open.
//
// NewAESGCMSealer returns the Sealer to use. Its methods must be safe for
// concurrent use, must not keep plaintext, sealed or binding after they
// return, and must not panic on any input. A Sealer that also implements
// idemstore.FingerprintKeyer keys the request fingerprints a Guard stores.
type Sealer interface {
	// Seal returns plaintext sealed (encrypted and authenticated) for
	// binding.
	Seal(plaintext, binding []byte) ([]byte, error)
	// Open returns the plaintext of a value sealed for binding, or an
	// error when it does not open: sealed with a key it does not hold,
	// altered, or sealed for another binding.
	Open(sealed, binding []byte) ([]byte, error)
}

// Sealed value format of NewAESGCMSealer:
//
//	version  1 byte, sealVersion
//	idLen    1 byte, the length of the key id (1 to maxKeyIDLen)
//	id       the key id
//	sealed   the 12-byte nonce, the ciphertext and the 16-byte tag
//
// The additional data authenticated with the ciphertext is the version, idLen
// and id, then the binding.
const sealVersion byte = 1

const (
	maxKeyIDLen = 32
	aesKeyLen   = 32
	// minFingerprintSecret is the shortest secret a FingerprintKeyer may
	// give.
	minFingerprintSecret = 16
)

// fingerprintLabel derives a key's fingerprint secret from its material, so
// that the key itself never serves two purposes.
const fingerprintLabel = "idem fingerprint v1"

// aesgcmSealer is the Sealer NewAESGCMSealer returns.
type aesgcmSealer struct {
	current string
	head    []byte                 // version, idLen and id of the current key
	aeads   map[string]cipher.AEAD // by key id
	fps     map[string][]byte      // fingerprint secrets, by key id
}

var (
	_ Sealer                     = (*aesgcmSealer)(nil)
	_ idemstore.FingerprintKeyer = (*aesgcmSealer)(nil)
)

// NewAESGCMSealer returns a Sealer that seals with AES-256-GCM under
// keys[current] and opens values sealed under any key in keys. Each sealed
// value carries its key's id, so values sealed before a rotation still open
// while their key stays listed. A key id is 1 to 32 characters of A-Z, a-z,
// 0-9, '_', '.' and '-'; keep it short (every sealed value and every stored
// fingerprint carries it). Each key must be 32 bytes of secret randomness.
// NewAESGCMSealer copies what it needs: later changes to keys do not matter.
//
// It returns an error for no keys, an invalid id, a key that is not 32
// bytes, or a current id that is not in keys; the error never holds key
// material.
//
// Nonces: each Seal draws a random 96-bit nonce, so a key may seal at most
// 2³² values before nonce reuse becomes a risk. Every completed operation
// seals one value, and every checkpoint one more: rotate long before a key
// has sealed 2³² values (at 1,000 sealed values a second, that is about 50
// days; rotating monthly keeps far below it).
//
// Rotation, with Guards on many processes sharing one store:
//  1. Add the new key to keys everywhere, the current id unchanged; deploy.
//  2. Make the new key current everywhere; deploy. Records written from now
//     on are sealed, and their fingerprints keyed, with it.
//  3. After one retention (the longest WithRetention or WithRouteRetention
//     in use) has passed since step 2, remove the old key; deploy.
//
// A record still sealed under a key that is no longer listed cannot be
// opened or verified: its operation gets ErrUnreadable, and its function is
// not run again.
//
// The Sealer also implements idemstore.FingerprintKeyer: the fingerprint secret of each
// key is HMAC-SHA-256(key, "idem fingerprint v1").
func NewAESGCMSealer(current string, keys map[string][]byte) (Sealer, error) {
	if len(keys) == 0 {
		return nil, errors.New("idem: NewAESGCMSealer: no keys")
	}
	s := &aesgcmSealer{current: current, aeads: make(map[string]cipher.AEAD, len(keys)), fps: make(map[string][]byte, len(keys))}
	for _, id := range slices.Sorted(maps.Keys(keys)) {
		if err := validKeyID(id); err != nil {
			return nil, fmt.Errorf("idem: NewAESGCMSealer: %w", err)
		}
		k := keys[id]
		if len(k) != aesKeyLen {
			return nil, fmt.Errorf("idem: NewAESGCMSealer: key %q is %d bytes; AES-256 needs %d", id, len(k), aesKeyLen)
		}
		block, err := aes.NewCipher(k)
		if err != nil {
			return nil, fmt.Errorf("idem: NewAESGCMSealer: key %q: %w", id, err)
		}
		if s.aeads[id], err = cipher.NewGCM(block); err != nil {
			return nil, fmt.Errorf("idem: NewAESGCMSealer: key %q: %w", id, err)
		}
		mac := hmac.New(sha256.New, k)
		mac.Write([]byte(fingerprintLabel))
		s.fps[id] = mac.Sum(nil)
	}
	if _, ok := keys[current]; !ok {
		return nil, fmt.Errorf("idem: NewAESGCMSealer: current key %q is not in keys", current)
	}
	s.head = append([]byte{sealVersion, byte(len(current))}, current...)
	return s, nil
}

// validKeyID reports why id is not a valid key id, or nil.
func validKeyID(id string) error {
	if id == "" || len(id) > maxKeyIDLen {
		return fmt.Errorf("key id %q must be 1 to %d characters", id, maxKeyIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return fmt.Errorf("key id %q: only A-Z, a-z, 0-9, '_', '.' and '-' are allowed", id)
		}
	}
	return nil
}

// Seal implements Sealer.
func (s *aesgcmSealer) Seal(plaintext, binding []byte) ([]byte, error) {
	aead := s.aeads[s.current]
	h := len(s.head)
	out := make([]byte, h+nonceLen, h+nonceLen+len(plaintext)+aead.Overhead())
	copy(out, s.head)
	rand.Read(out[h:]) // never fails (crypto/rand, Go 1.24+)
	return aead.Seal(out, out[h:], plaintext, additionalData(s.head, binding)), nil
}

// nonceLen is the length of a GCM nonce.
const nonceLen = 12

// Open implements Sealer. Its errors wrap ErrUnreadable.
func (s *aesgcmSealer) Open(sealed, binding []byte) ([]byte, error) {
	head, id, ok := splitSealed(sealed)
	if !ok {
		return nil, fmt.Errorf("%w: not a value sealed by NewAESGCMSealer's Sealer", ErrUnreadable)
	}
	aead, ok := s.aeads[id]
	if !ok {
		return nil, fmt.Errorf("%w: sealed with key %q, which is not listed", ErrUnreadable, id)
	}
	rest := sealed[len(head):]
	if len(rest) < nonceLen+aead.Overhead() {
		return nil, fmt.Errorf("%w: sealed with key %q, but too short", ErrUnreadable, id)
	}
	p, err := aead.Open(nil, rest[:nonceLen], rest[nonceLen:], additionalData(head, binding))
	if err != nil {
		return nil, fmt.Errorf("%w: does not open under key %q: altered, or sealed for another operation or slot", ErrUnreadable, id)
	}
	return p, nil
}

// FingerprintKeys implements idemstore.FingerprintKeyer.
func (s *aesgcmSealer) FingerprintKeys() (string, map[string][]byte) {
	out := make(map[string][]byte, len(s.fps))
	for id, k := range s.fps {
		out[id] = slices.Clone(k)
	}
	return s.current, out
}

// splitSealed returns the head of a value in NewAESGCMSealer's format and
// its key id, and reports whether it has that format.
func splitSealed(b []byte) (head []byte, id string, ok bool) {
	if len(b) < 2 || b[0] != sealVersion {
		return nil, "", false
	}
	n := int(b[1])
	if n == 0 || n > maxKeyIDLen || len(b) < 2+n {
		return nil, "", false
	}
	id = string(b[2 : 2+n])
	if validKeyID(id) != nil {
		return nil, "", false
	}
	return b[:2+n], id, true
}

// additionalData is what GCM authenticates beside the ciphertext: the
// value's head, then the binding.
func additionalData(head, binding []byte) []byte {
	ad := make([]byte, 0, len(head)+len(binding))
	return append(append(ad, head...), binding...)
}

// listedKeys renders the key ids of a Guard's fingerprint keys for a log.
func listedKeys(ids []string) string {
	if len(ids) == 0 {
		return "none"
	}
	return strings.Join(ids, ",")
}
