package main

import (
	"context"
	"crypto/x509"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/internal/redisurl"
)

// The CLI's dial timeout and attempts, unless the URL sets them: an
// operator waiting on an unreachable server wants to know soon.
const (
	dialTimeout   = 3 * time.Second
	dialerRetries = 1
)

// quietLogger drops go-redis's own log lines: the CLI reports errors once,
// on one line.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// connect returns a client for a -redis URL (see the package doc and
// internal/redisurl), and a description of where it points, without
// credentials. With roots, a TLS URL trusts those CAs instead of the
// system's. It does no I/O.
func connect(raw string, roots *x509.CertPool) (redis.UniversalClient, string, error) {
	return redisurl.Client(raw, redisurl.Options{Roots: roots, DialTimeout: dialTimeout, DialerRetries: dialerRetries})
}
