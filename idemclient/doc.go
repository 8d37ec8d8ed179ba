// Package idemclient is the caller's side of idem: it makes HTTP requests
// safe to retry, and retries them.
//
// NewTransport returns an http.RoundTripper that sends an idempotency key
// with each POST and PATCH request (the header Idempotency-Key, as the IETF
// draft "The Idempotency-Key HTTP Header Field" names it) and retries
// network errors, 409 (while the first request with the key still runs),
// 429 and 503 with the same key, honouring Retry-After. A server behind
// idem's middleware (github.com/idemkit/idem) runs the request once and
// answers every retry with the first response.
//
// The key belongs to the user's intent, not to one call: create it with
// NewKey when the intent is created (the Pay button is shown), keep it with
// the intent, and pass it with WithKey on the context of every attempt. A
// request without one gets a new key per call. KeyFrom reads it back, for
// other clients (the gRPC and Connect interceptors of idem's contrib
// modules read it too), and from resp.Request.Context() the key the
// transport used, as created. A replayed answer carries ReplayedHeader.
//
// The package depends on the standard library only: a service that only
// calls others does not link the server's Redis client.
package idemclient
