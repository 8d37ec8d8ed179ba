// Package idemcaddy is a Caddy module that puts idem's HTTP contract in
// front of whatever a Caddy route serves, typically reverse_proxy: each
// request carrying an idempotency key runs the upstream once, across every
// Caddy instance sharing one Redis, and its repeats get the stored response
// with Idempotent-Replayed: true (docs/http.md is the contract).
//
// It registers the handler http.handlers.idempotency and the Caddyfile
// directive idempotency, ordered before reverse_proxy:
//
//	idempotency {
//		redis redis://127.0.0.1:6379
//		scope_header X-Account
//		wait 5s
//		lease 30s
//	}
//	reverse_proxy 127.0.0.1:8080
//
// A keyed request of a configured method (POST and PATCH by default) gets
// idem's middleware: one upstream execution, the stored status, headers and
// body on repeats, duplicates waiting up to wait, 422 for a key reused with
// another request, 503 when Redis does not answer (the upstream is not
// called). Requests without a key, and other methods, pass through
// (require_key answers them with 400). With scope_header, keys are scoped
// by that header's value and a keyed request without it is refused; the
// header must be set by a layer in front that drops any value the client
// sent. Without it, all clients share one key space, which the module logs
// at provision.
//
// The upstream receives Idempotency-Key as sent and Idempotency-Attempt: N,
// the attempt's fence (a client-sent Idempotency-Attempt is removed). When
// the upstream fails after the request was sent (the connection dropped,
// no response in time), the client gets 502 (504 for a timeout) as a
// problem response and the key is neither released nor completed: no retry
// reaches the upstream before the lease runs out, and the first one after
// takes over as attempt 2. A failure before the request was sent (a refused
// connection) releases the key. Statuses the upstream answered follow the
// middleware's storage rules: 5xx, 408, 409, 425 and 429 release the key,
// others are stored; store_5xx stores the upstream's 5xx answers too (never
// the module's own 502 and 504).
//
// The redis URL is one the idem command takes: redis://, rediss://,
// unix://, redis+sentinel:// (a master through its Sentinels) or
// redis+cluster:// (ca_cert names the CA of a TLS server). store_timeout
// bounds each Redis call of a request (default 1s), whatever the URL's
// timeouts. max_response_body 0 stores a response's status and headers but
// no body.
//
// The module registers idem's metrics (contrib/idemprom) in Caddy's metrics
// registry, so Caddy's admin endpoint serves them at /metrics under the
// names idem proxy serves them.
//
// Handlers with the same redis URL and ca_cert share one Redis client, kept
// across configuration reloads and closed when the last configuration using
// it is unloaded.
package idemcaddy
