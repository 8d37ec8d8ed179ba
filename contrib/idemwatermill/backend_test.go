package idemwatermill_test

import "github.com/idemkit/idem/contrib/internal/backendtest"

// The Redis servers these tests run on: miniredis and a real redis-server,
// behind a store that can be taken down (contrib/internal/backendtest).
type backend = backendtest.Backend

var forEachBackend = backendtest.ForEach
