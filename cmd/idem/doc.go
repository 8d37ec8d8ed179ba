// Command idem inspects and clears the records that idem keeps in Redis,
// checks and tries a Redis server for idem, serves idem's HTTP contract in
// front of a service (proxy), and prints its own version.
//
//	idem inspect -redis URL [-cacert FILE] [-timeout D] [-prefix P] [-kind do|once|http] [-scope S] [-json] KEY
//	idem forget  -redis URL [-cacert FILE] [-timeout D] [-prefix P] [-kind do|once|http] [-scope S] [-force] -yes KEY
//	idem scan    -redis URL [-cacert FILE] [-timeout D] [-prefix P] [-sample N] [-json]
//	idem check   -redis URL [-cacert FILE] [-timeout D] [-prefix P] [-strict]
//	idem verify  -redis URL [-cacert FILE] [-timeout D] [-prefix P] [-duration 30s] [-workers 16] [-keys N] [-payload BYTES] [-rate N] [-replica-ack N] [-json]
//	idem proxy   -listen ADDR -upstream URL -redis URL [-cacert FILE] [-prefix P] [-methods POST,PATCH] [-key-header NAME | -key-json POINTER] [-fingerprint-json POINTERS] [-require-key] [-scope-header NAME] [-wait D] [-lease D] [-retention D] [-max-body N] [-max-response N] [-store-5xx] [-upstream-timeout D] [-upstream-cacert FILE] [-admin ADDR] [-shutdown-timeout D] [-store-timeout D] [-log-requests=false]
//	idem version
//
// inspect shows one operation: its state (absent, in_progress, completed),
// fence, lease and its holder, checkpoints, creation time, remaining TTL and,
// once completed, what a repeat gets (status, headers and body size of a
// stored response; type and size of a stored result; for a Once record,
// which holds no value, that its id was processed). KEY is the key as the
// application received it (for http, bare or quoted as in the header); -kind
// says which API ran it (Do: do, the default; Guard.Once: once; the HTTP
// middleware: http) and -scope, for http, the value of the middleware's
// WithScope for the request. When the operation is absent, inspect looks the
// key up under the other kinds (and http without a scope) and prints a hint:
// where it found a record, or that a -scope may be missing.
//
// forget deletes an operation's record and lease so that its key runs again
// as new; it changes nothing without -yes, and refuses while a live lease
// holds the operation unless -force is given.
//
// scan samples the records under the prefix with SCAN (never KEYS) and
// reports their count by state and the distribution of their memory and TTL;
// it needs a user that may run SCAN, DBSIZE, GETRANGE and MEMORY USAGE (the
// idem-ops user of docs/operations.md), not the application's.
// check reports every server's name (Redis, Valkey) and version, eviction
// policy, persistence and replicas, and fails for a server idem cannot use.
//
// verify runs idem against the deployment for -duration, as an application
// would, and checks what every caller got: workers call Do with new keys,
// with repeats of keys at random later times and with concurrent
// duplicates, over at most -keys keys, starting at most -rate calls a
// second (all workers together; the final probes, one per key, are not
// paced); each function acts on a fenced effect sink in memory. It then
// reports the operations, duplicate effects, lost results, divergent
// replays, errors by kind with what each means (canceled: calls cut short
// when -duration ran out), and the p50/p99 latency, and fails when an
// invariant was violated. Evictions and restarts or failovers seen
// meanwhile are named as the cause. It writes only under a prefix of its
// own, P:verify-RANDOM for -prefix P (default idem), which the
// application's ACL pattern ~P:* covers, with TTLs of minutes, and deletes
// what it wrote at the end (SCAN, DEL); for verify, -timeout bounds the
// set-up and each call, not the run. With -json, the last line is one JSON
// object (operations, duplicates, lost, violations, ...).
//
// proxy serves the HTTP middleware's contract in front of an upstream
// service, as a sidecar or a gateway (docs/proxy.md): a keyed request of
// -methods runs once upstream, its repeats get the stored response. The
// upstream gets the key as sent and Idempotency-Attempt: N, the attempt's
// fence (never a client's value). An upstream failure before the request was
// sent releases the key (502); after it was sent (the connection dropped,
// the response timed out: 502, 504) the key stays in progress until its
// -lease runs out, and the retry after that is attempt 2. With
// -scope-header, keys are scoped by that header's value and a keyed request
// without it is refused; that header must be set by an authenticating layer
// in front that drops the client's own value. It checks Redis as check does
// at start (-timeout bounds it), logs one JSON line per request on standard
// error, serves /healthz and /readyz on -admin, and on SIGTERM or SIGINT lets
// in-flight requests finish for up to -shutdown-timeout. Each of its flags
// may also be set by an environment variable, IDEM_ and the flag's name in
// upper case with '-' as '_' (IDEM_UPSTREAM, IDEM_SCOPE_HEADER,
// IDEM_REQUIRE_KEY=true); a flag on the command line wins over its
// variable, an empty variable counts as unset, and one whose value does not
// parse is a usage error that names it. -redis falls back to REDIS_URL
// after IDEM_REDIS. The other commands take flags only.
//
// version (also -version, --version) prints the version of the command's
// module, github.com/idemkit/idem/cmd/idem, in the binary and the Go
// version that built it, on one line: "idem v0.1.0 go1.26.8" when installed
// with go install github.com/idemkit/idem/cmd/idem@v0.1.0, or run as a tool
// of a module that requires it at v0.1.0 (go get -tool
// github.com/idemkit/idem/cmd/idem@v0.1.0, then go tool idem); "(devel)"
// for a build in idem's repository. It takes no Redis.
//
// URL is one of
//
//	redis://[user:password@]host[:port][/db][?option=value...]     one server (rediss:// for TLS)
//	redis+sentinel://[user:password@]host[:port][,host[:port]...]/master[/db][?option=value...]
//	redis+cluster://[user:password@]host[:port][,host[:port]...][?option=value...]
//
// For Sentinel, the hosts are the Sentinels (default port 26379), master is
// the monitored master's name, and user and password are the data nodes';
// the options sentinel_username and sentinel_password authenticate to the
// Sentinels. For Redis Cluster, the hosts are any of its nodes. The options
// are go-redis's URL options (dial_timeout=3s, read_timeout=5s, ...); the
// rediss+sentinel and rediss+cluster schemes use TLS. Without -redis, the
// URL is taken from the REDIS_URL environment variable. -timeout D (default
// 10s) bounds a command, connecting included.
//
// A TLS URL trusts the system's CAs (on Unix, SSL_CERT_FILE names a file of
// them instead); -cacert FILE names the PEM file of the CA that signed the
// servers' certificates. Connecting and the TLS handshake are bounded by the
// dial timeout (3s unless the URL's dial_timeout says otherwise); a server
// whose certificate is not trusted is a one-line error that says so.
//
// Exit status: 0 on success, 1 when the command failed (the reason is one
// line on standard error), 2 for a usage error.
package main
