package idemstore

import "context"

// Watcher is implemented by stores that can tell a waiting duplicate when an
// operation is completed or released, so that it need not poll. The engine
// uses it when present; a store without it is polled.
type Watcher interface {
	// Watch starts watching the operation id. The returned channel
	// receives a value when the operation is completed or released after
	// Watch returned (a notification may be lost: the caller still checks
	// now and then). stop ends the watch and must be called. An error means
	// the store cannot watch now; the caller polls instead.
	Watch(ctx context.Context, id string) (notify <-chan struct{}, stop func(), err error)
}
