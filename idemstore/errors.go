package idemstore

import "errors"

// Errors a store returns. Package idem names the same values (idem.ErrLeaseLost,
// idem.ErrStoreUnavailable), so errors.Is matches either name.
var (
	// ErrLeaseLost reports that the caller no longer owns the key: its lease
	// expired and another attempt took the key over. Store methods return
	// it when the owner token they are given does not own the record.
	ErrLeaseLost = errors.New("idem: lease lost")

	// ErrStoreUnavailable reports that the store could not be reached. A
	// store may wrap it to say that it cannot work at all (a nil store, a
	// client it cannot use); the engine wraps every other store error in it.
	ErrStoreUnavailable = errors.New("idem: store unavailable")
)
