// Command idem inspects and clears the records that idem keeps in Redis,
// checks and tries a Redis server for idem, serves idem's HTTP contract in
// front of a service (proxy), and prints its own version.
//
//	idem inspect -redis URL [-cacert FILE] [-timeout D] [-prefix P] [-kind do|once|http] [-scope S] [-json] KEY
//	idem forget  -redis URL [-cacert FILE] [-timeout D] [-prefix P] [-kind do|once|http] [-scope S] [-force] -yes KEY
//	idem scan    -redis URL [-cacert FILE] [-timeout D] [-prefix P] [-sample N] [-json]
//	idem check   -redis URL [-cacert FILE] [-timeout D] [-prefix P] [-strict]
//	idem verify  -redis URL [-cacert FILE] [-timeout D] [-prefix P] [-duration 30s] [-workers 16] [-keys N] [-payload BYTES] [-rate N] [-replica-ack N] [-json]
//	idem proxy   -listen ADDR -upstream URL -redis URL [-cacert FILE] [-prefix P] [-methods POST,PATCH] [-key-header NAME | -key-json POINTER] [-fingerprint-json POINTERS] [-require-key] [-scope-header NAME] [-wait D] [-lease D] [-retention D] [-max-body N] [-max-response N] [-store-5xx] [-upstream-timeout D] [-upstream-cacert FILE] [-admin ADDR] [-shutdown-timeout D]
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
// in-flight requests finish for up to -shutdown-timeout.
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

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redisauth"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// errUsage marks a usage error; the flag set has printed the details.
var errUsage = errors.New("usage")

const usage = `usage:
  idem inspect -redis URL [-cacert FILE] [-timeout D] [-prefix P] [-kind do|once|http] [-scope S] [-json] KEY
  idem forget  -redis URL [-cacert FILE] [-timeout D] [-prefix P] [-kind do|once|http] [-scope S] [-force] -yes KEY
  idem scan    -redis URL [-cacert FILE] [-timeout D] [-prefix P] [-sample N] [-json]
  idem check   -redis URL [-cacert FILE] [-timeout D] [-prefix P] [-strict]
  idem verify  -redis URL [-cacert FILE] [-timeout D] [-prefix P] [-duration 30s] [-workers 16] [-keys N] [-payload BYTES] [-rate N] [-replica-ack N] [-json]
  idem proxy   -listen ADDR -upstream URL -redis URL [-cacert FILE] [-prefix P] [-methods POST,PATCH] [-key-header NAME | -key-json POINTER]
               [-require-key] [-scope-header NAME] [-wait D] [-lease D] [-retention D] [-max-body N] [-admin ADDR] [more: idem proxy -h]
  idem version
URL: redis://host:port/db, redis+sentinel://host:port,host:port/master, redis+cluster://host:port,host:port
     (rediss:// and rediss+... for TLS; -cacert FILE names the CA, as SSL_CERT_FILE does)
Run "idem COMMAND -h" for a command's flags; "go doc github.com/idemkit/idem/cmd/idem" for the details.
`

// command is one subcommand: its flags, bound to its own options, and its
// action, run once the flags are parsed.
type command struct {
	fs  *flag.FlagSet
	run func(ctx context.Context, env *env) error
	// long: the command runs longer than -timeout, which bounds each of
	// its steps instead (env.timeout).
	long bool
}

// env is what a command works with once its flags are parsed.
type env struct {
	name           string // the command's name
	stdout, stderr io.Writer
	args           []string // positional arguments
	client         redis.UniversalClient
	target         string        // where client points, for messages
	timeout        time.Duration // -timeout
}

// run runs the command line args and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	redis.SetLogger(quietLogger{})
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	name := args[0]
	if name == "version" || name == "-version" || name == "--version" {
		if len(args) > 1 {
			fmt.Fprintf(stderr, "idem version: version takes no arguments, got %q\n", args[1:])
			return exitUsage
		}
		printVersion(stdout)
		return exitOK
	}
	var common commonFlags
	cmd, ok := commands(name, &common)
	if !ok {
		fmt.Fprintf(stderr, "idem: unknown command %q\n%s", name, usage)
		return exitUsage
	}
	cmd.fs.SetOutput(stderr)
	if err := cmd.fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	err := common.execute(ctx, cmd, &env{name: name, stdout: stdout, stderr: stderr, args: cmd.fs.Args()})
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errUsage):
		return exitUsage
	}
	fmt.Fprintf(stderr, "idem %s: %v\n", name, err)
	return exitFail
}

// commonFlags are the flags every command has.
type commonFlags struct {
	redisURL string
	caCert   string
	timeout  time.Duration
}

func (c *commonFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.redisURL, "redis", "", "Redis `URL`: redis://, redis+sentinel:// or redis+cluster:// (default $REDIS_URL)")
	fs.StringVar(&c.caCert, "cacert", "", "PEM `FILE` of the CA that signed the server's certificate, for rediss:// (default: the system's CAs, or $SSL_CERT_FILE)")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "give up after `D`, a duration such as 30s or 2m")
}

// execute connects to Redis and runs cmd within the timeout.
func (c *commonFlags) execute(ctx context.Context, cmd *command, e *env) error {
	if c.redisURL == "" {
		c.redisURL = os.Getenv("REDIS_URL") // not the flag's default: -h would print its password
	}
	if c.redisURL == "" {
		return usageError(e, "no Redis: pass -redis URL or set REDIS_URL")
	}
	var roots *x509.CertPool
	if c.caCert != "" {
		if !tlsScheme(c.redisURL) {
			return usageError(e, "-cacert applies to TLS URLs only (rediss://, rediss+sentinel://, rediss+cluster://)")
		}
		var err error
		if roots, err = loadCACert(c.caCert); err != nil {
			return usageError(e, "-cacert: "+err.Error())
		}
	}
	client, target, err := connect(c.redisURL, roots)
	if err != nil {
		return usageError(e, "-redis: "+err.Error())
	}
	defer client.Close()
	e.client, e.target, e.timeout = client, target, c.timeout
	if c.timeout > 0 && !cmd.long {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	err = explainTLS(cmd.run(ctx, e), c.redisURL)
	err = redisauth.Explain(err, target, client)
	if err != nil && ctx.Err() != nil && !errors.Is(err, errUsage) {
		return fmt.Errorf("%s: no answer within %v (-timeout): %w", target, c.timeout, err)
	}
	return err
}

// A commandSpec makes a command: it registers the command's own flags on
// fs and returns how to run it, and whether it runs longer than -timeout
// (which then bounds each of its steps instead).
type commandSpec func(fs *flag.FlagSet) (run func(ctx context.Context, e *env) error, long bool)

// commandSpecs holds the commands by name; each command's file registers
// its own.
var commandSpecs = map[string]commandSpec{}

// register adds the command called name.
func register(name string, spec commandSpec) bool {
	commandSpecs[name] = spec
	return true
}

// commands returns the command called name, with its flags registered.
func commands(name string, common *commonFlags) (*command, bool) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	common.register(fs)
	spec, ok := commandSpecs[name]
	if !ok {
		return nil, false
	}
	run, long := spec(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage of idem %s:\n", name)
		fs.PrintDefaults()
	}
	return &command{fs: fs, run: run, long: long}, true
}

// operationFlags name one operation.
type operationFlags struct {
	prefix, kind, scope string
}

func registerOperationFlags(fs *flag.FlagSet) *operationFlags {
	o := &operationFlags{}
	fs.StringVar(&o.prefix, "prefix", "idem", "key `prefix` of the store (idem.WithPrefix)")
	fs.StringVar(&o.kind, "kind", "do", "what ran the operation: do (idem.Do), once (Guard.Once) or http (Guard.Middleware)")
	fs.StringVar(&o.scope, "scope", "", "the request's scope (WithScope), for -kind http")
	return o
}

// operation resolves the flags and the KEY argument into an operation.
func (o *operationFlags) operation(e *env) (operation, error) {
	var op operation
	switch len(e.args) {
	case 0:
		return op, usageError(e, "missing KEY")
	case 1:
	default:
		return op, usageError(e, fmt.Sprintf("one KEY expected, got %d arguments (flags go before the key)", len(e.args)))
	}
	for _, k := range []idem.Kind{idem.KindDo, idem.KindOnce, idem.KindHTTP} {
		if k.String() == o.kind {
			op.kind = k
		}
	}
	switch {
	case op.kind == 0:
		return op, usageError(e, fmt.Sprintf("-kind %q: want do, once or http", o.kind))
	case o.scope != "" && op.kind != idem.KindHTTP:
		return op, usageError(e, "-scope applies to -kind http only: Do keys and Once ids have no scope")
	}
	op.scope, op.key = o.scope, e.args[0]
	if op.kind == idem.KindHTTP && strings.HasPrefix(op.key, `"`) {
		key, ok := unquote(op.key)
		if !ok {
			return op, usageError(e, fmt.Sprintf("KEY %s: a quoted key must be an RFC 8941 string, as the middleware reads it", op.key))
		}
		op.key = key
	}
	op.id = idem.OperationID(op.kind, op.scope, op.key)
	op.store = idem.NewRedisStore(e.client, idem.WithPrefix(o.prefix))
	return op, nil
}

// operation is one operation, named as its user knows it.
type operation struct {
	kind       idem.Kind
	scope, key string
	id         string
	store      *idem.RedisStore
}

// unquote reads an Idempotency-Key sent as an RFC 8941 string, as the
// middleware does: in double quotes, with \" and \\ the only escapes.
func unquote(v string) (string, bool) {
	if len(v) < 2 || v[len(v)-1] != '"' {
		return "", false
	}
	var b strings.Builder
	for i := 1; i < len(v)-1; i++ {
		c := v[i]
		switch {
		case c == '\\' && i+1 < len(v)-1 && (v[i+1] == '"' || v[i+1] == '\\'):
			i++
			c = v[i]
		case c == '\\' || c == '"':
			return "", false
		}
		b.WriteByte(c)
	}
	return b.String(), true
}

// recordKey returns the Redis key of the operation's record.
func (op operation) recordKey() string {
	k, _ := op.store.Keys(op.id)
	return k
}

// usageError prints a usage error and returns errUsage.
func usageError(e *env, msg string) error {
	fmt.Fprintf(e.stderr, "idem %s: %s\n", e.name, msg)
	return errUsage
}
