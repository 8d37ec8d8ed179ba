package idemstore

import "strings"

// FingerprintKeyer is implemented by an idem.Sealer that also keys the
// request fingerprints a Guard stores, so that reading the store does not confirm a
// guessed request. A Guard with such a Sealer stores KEYID.MAC, the
// HMAC-SHA-256 of the plain fingerprint under the current key's secret
// (first 128 bits, base64url), and recognises a record keyed with any
// listed key: a retry after a key rotation still replays, and a changed
// request still gets idem.ErrMismatch.
//
// A Sealer without it leaves fingerprints as they are without one: the
// SHA-256 of the request. idem.NewAESGCMSealer's Sealer implements it.
type FingerprintKeyer interface {
	// FingerprintKeys returns the id of the current key and the fingerprint
	// secret of every listed key, by id, the current one among them. Ids
	// follow idem.NewAESGCMSealer's rules; a secret must be at least 16 bytes
	// and stay the same for as long as its id is listed. Every Guard
	// sharing a store must get the same secret for an id.
	FingerprintKeys() (current string, secrets map[string][]byte)
}

// MatchFingerprint reports how a record that holds the fingerprint stored
// relates to the request c: ClaimOK when it is the same request, ClaimMismatch
// when it is another, ClaimUnreadable when c cannot tell.
//
// A keyed fingerprint is KEYID.MAC (the key id, a dot, then base64url, which
// has no dot); a plain one has no dot. A stored fingerprint equal to
// c.Fingerprint, or to one of c.OtherFingerprints, is the same request. One
// keyed with the key of c.Fingerprint or of one of c.OtherFingerprints is
// another request. Anything else (a key c does not list, a keyed record met
// by a plain request, a plain record met by a keyed request) can be neither
// verified nor opened: ClaimUnreadable. claim.lua is the same rule in Lua.
func (c ClaimRequest) MatchFingerprint(stored string) ClaimStatus {
	if stored == c.Fingerprint {
		return ClaimOK
	}
	kid, keyed := fingerprintKeyID(stored)
	if own, ownKeyed := fingerprintKeyID(c.Fingerprint); kid == own && keyed == ownKeyed {
		return ClaimMismatch
	}
	if !keyed {
		return ClaimUnreadable
	}
	for _, o := range c.OtherFingerprints {
		if o == stored {
			return ClaimOK
		}
		if k, _ := fingerprintKeyID(o); k == kid {
			return ClaimMismatch
		}
	}
	return ClaimUnreadable
}

// fingerprintKeyID returns the key id of a keyed fingerprint (KEYID.MAC),
// and reports whether fp is keyed.
func fingerprintKeyID(fp string) (string, bool) {
	i := strings.LastIndexByte(fp, '.')
	if i < 0 {
		return "", false
	}
	return fp[:i], true
}
