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
	"github.com/idemkit/idem/internal/redisurl"
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
	// env: each flag may also come from its environment variable
	// (registerServer).
	env bool
}

// env is what a command works with once its flags are parsed.
type env struct {
	name           string // the command's name
	stdout, stderr io.Writer
	args           []string // positional arguments
	client         redis.UniversalClient
	target         string        // where client points, for messages
	timeout        time.Duration // -timeout
	strayEnv       []string      // IDEM_ variables that are no flag's (registerServer)
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
	e := &env{name: name, stdout: stdout, stderr: stderr, args: cmd.fs.Args()}
	if cmd.env {
		if err := setFromEnv(cmd.fs, os.LookupEnv); err != nil {
			fmt.Fprintf(stderr, "idem %s: %v\n", name, err)
			return exitUsage
		}
		e.strayEnv = unknownEnv(cmd.fs, os.Environ())
	}
	err := common.execute(ctx, cmd, e)
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
		if cmd.env {
			return usageError(e, "no Redis: pass -redis URL or set IDEM_REDIS or REDIS_URL")
		}
		return usageError(e, "no Redis: pass -redis URL or set REDIS_URL")
	}
	var roots *x509.CertPool
	if c.caCert != "" {
		if !redisurl.TLS(c.redisURL) {
			return usageError(e, "-cacert applies to TLS URLs only (rediss://, rediss+sentinel://, rediss+cluster://)")
		}
		var err error
		if roots, err = redisurl.LoadCACert(c.caCert); err != nil {
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
	byEnv := configuredByEnvironment[name]
	if byEnv {
		annotateEnv(fs)
	}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage of idem %s:\n", name)
		if byEnv {
			fmt.Fprint(fs.Output(), envUsage)
		}
		fs.PrintDefaults()
	}
	return &command{fs: fs, run: run, long: long, env: byEnv}, true
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
