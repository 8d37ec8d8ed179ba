package idemconnect_test

import "github.com/idemkit/idem/contrib/internal/backendtest"

// backend is the Redis a test runs on, miniredis or a redis-server of the
// test's own, which the test may take down (internal/backendtest).
type backend = backendtest.Killable

// forEachBackend runs a test on miniredis and on a real redis-server.
var forEachBackend = backendtest.ForEachKillable
