// # Testing code that uses idem
//
// The package also helps test your own code: the functions you pass to
// idem.Do and Guard.Once, and the handlers you put under Guard.Middleware.
//
// A Guard without Redis, in one call, for unit tests: NewGuard. It runs on a
// MemoryStore, an in-memory idemstore.Store that passes Run, keeps its own clock
// (MemoryStore.Advance lets leases and records expire without sleeping) and
// reads its records back (idem.OperationID names them):
//
//	g := idemtest.NewGuard()
//	receipt, err := idem.Do(ctx, g, "order-42", req, charge)
//
// The branch of your function that reconciles after a crash (Attempt.Fence
// > 1, with the checkpoints of the attempt that died) runs with
// NewAttemptGuard, or AsAttempt around any store:
//
//	g := idemtest.NewAttemptGuard(2, map[string][]byte{"charge_id": []byte("ch_1")})
//	receipt, err := idem.Do(ctx, g, "order-42", req, charge) // charge sees Fence 2 and charge_id
//
// The design's concurrency test, for a handler: Parallel sends the same
// request n times at once through the middleware and reports how many times
// the handler ran.
//
//	res := idemtest.Parallel(16, req, g.Middleware(), payments)
//	// res.Ran == 1; res.Statuses counts 201s and 409s (or, with WithWait, replays)
//
// A handler finds its attempt with idem.AttemptFrom, which reports false
// outside the middleware (in a unit test that calls the handler directly):
// check ok before using the Attempt. To test against a real Redis protocol
// without a server, pass a go-redis client of an embedded Redis (such as
// github.com/alicebob/miniredis/v2, in your tests) to idem.NewRedisStore;
// the package's examples show each of these.
package idemtest
