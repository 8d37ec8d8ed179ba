// Package idem makes retried, duplicated and concurrent requests harmless.
//
// A phone pays, the network drops the answer, the app retries: without
// protection the customer is charged twice. With idem, any number of
// stateless replicas share one Redis (or Redis Cluster); an operation carrying
// an idempotency key runs its side effect once, and every repeat gets the
// first result back.
//
// # The lifecycle of a key
//
// One logical operation is one key, created by the client when the intent is
// created and reused on every retry. Its record goes through these states:
//
//   - absent: the first call claims the key in one round trip. A Lua script
//     takes a lease key with SET NX PX and writes an IN_PROGRESS record
//     holding the request's fingerprint, a fresh owner token and a fence
//     (1 on the first attempt).
//   - in progress: the function runs while a heartbeat renews the lease every
//     lease/3. A duplicate arriving meanwhile gets ErrInProgress with the
//     lease's remaining time, or, with WithWait, waits for the result. A
//     holder that crashes stops renewing; once its lease expires, the next
//     call takes the key over with Fence+1 and sees the dead attempt's
//     checkpoints. A holder that froze past its lease finds its context
//     cancelled with cause ErrLeaseLost and cannot store its result.
//   - completed: one compare-and-complete script stores the result, only if
//     the caller still owns the record, and drops the lease. Every repeat gets
//     the stored result in one round trip.
//   - expired: completed records live for the retention (WithRetention,
//     default 24h); unfinished ones at most lease + retention after their
//     last claim. Redis expiry is the only cleanup. A key that returns after
//     its record expired is new: it runs again, with Fence 1.
//
// When the outcome must not be kept — an error from the function, a panic,
// by default an HTTP 5xx, 408, 409, 425 or 429 — the claim is released, so
// the next retry runs again with Fence+1 and the checkpoints.
//
// # The same request
//
// A key stands for one request. Do fingerprints its req argument (SHA-256 of
// canonical JSON); the HTTP middleware fingerprints the method, path, query
// and body. A repeat of a key with another fingerprint is a client bug and
// gets ErrMismatch (HTTP 422), never an unrelated stored response. Keys are
// at most 255 bytes of printable ASCII; a UUID is the usual choice.
//
// # External side effects
//
// A Redis record cannot commit atomically with a payment provider. Pass
// Attempt.ID, the operation's stable id, to the provider as its idempotency
// key; save the provider's references with Attempt.Checkpoint; and when
// Attempt.Fence > 1, an earlier attempt died mid-way: ask the provider about
// Attempt.ID before charging again.
//
// # Guarantees and their limits
//
// A function runs at most once per key while Redis keeps its writes and the
// holder's lease is honoured. Redis can lose writes in an asynchronous
// failover (a replica promoted before it received the claim or the result)
// and under eviction (every idem key carries a TTL, so any maxmemory-policy
// but noeviction may drop them). Use noeviction and persistence; WithReplicaAck
// waits for replicas; RedisStore.Check warns at start-up.
package idem
