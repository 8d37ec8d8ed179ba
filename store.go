package idem

// What the Guard asks of its store beyond idemstore.Store.

// deadlineStore is a store that may know that its calls return by the
// deadline of their context.
type deadlineStore interface {
	honoursDeadlines() bool
}
