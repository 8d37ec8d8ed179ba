package rpcidem

import (
	"context"
	mrand "math/rand/v2"
	"time"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/internal/wire"
)

const (
	defaultAttempts   = 5
	defaultBackoff    = 200 * time.Millisecond
	defaultBackoffCap = 10 * time.Second
	// maxRetryDelay is the longest RetryInfo delay the client waits for; an
	// error asking for more is returned at once.
	maxRetryDelay = 30 * time.Second
)

// ClientConfig holds the client options: the modules' ClientOption
// functions set it.
type ClientConfig struct {
	attempts int
	backoff  backoff
}

// SetMaxAttempts sets how many times one call is sent at most; values below
// 1 mean 1.
func (c *ClientConfig) SetMaxAttempts(n int) { c.attempts = max(n, 1) }

// SetBackoff sets the backoff between attempts; a base of zero or less keeps
// the default base.
func (c *ClientConfig) SetBackoff(base, limit time.Duration) {
	if base > 0 {
		c.backoff.base = base
	}
	c.backoff.limit = limit
}

// Client is the protocol-independent part of a client interceptor.
type Client struct {
	cfg ClientConfig
}

// NewClient returns the client part of an interceptor, with the defaults
// (5 attempts, backoff from 200ms to 10s) changed by opts.
func NewClient[O ~func(*ClientConfig)](opts []O) *Client {
	c := ClientConfig{attempts: defaultAttempts, backoff: backoff{base: defaultBackoff, limit: defaultBackoffCap}}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	c.backoff.limit = max(c.backoff.limit, c.backoff.base)
	return &Client{cfg: c}
}

// SendKey returns the key a call without one of its own sends: the key set by
// idemclient.WithKey on ctx, else a new one (idemclient.NewKey). A key from
// ctx that is not valid is an error wrapping idem.ErrInvalidKey.
func SendKey(ctx context.Context) (string, error) {
	key, ok := idemclient.KeyFrom(ctx)
	if !ok {
		return idemclient.NewKey(), nil
	}
	return key, wire.ValidKey(key)
}

// Failure is what the client reads from a failed call's error.
type Failure struct {
	Code uint32
	// RetryDelay is the delay of the error's errdetails.RetryInfo, when
	// HasRetryInfo.
	RetryDelay   time.Duration
	HasRetryInfo bool
}

// Retry calls send (attempt counts from 1) until it succeeds, the attempts
// run out, or an error is not to be retried, and returns send's last error.
// read returns what an error says, and false for an error that is not a
// status. An error is retried, after its RetryInfo delay, when it is
// Unavailable or Aborted with a RetryInfo (returned at once when the delay
// is longer than 30s or than the time left before ctx's deadline), and after
// a full-jitter backoff when it is Unavailable without one. When ctx ends
// during a wait, Retry returns ctx's error and ended true.
func (c *Client) Retry(ctx context.Context, send func(attempt int) error, read func(error) (Failure, bool)) (err error, ended bool) {
	for attempt := 1; ; attempt++ {
		err := send(attempt)
		if err == nil || attempt >= c.cfg.attempts || ctx.Err() != nil {
			return err, false
		}
		f, ok := read(err)
		if !ok {
			return err, false
		}
		wait, retry := c.wait(f, attempt)
		if !retry {
			return err, false
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= wait {
			return err, false // the deadline would end the wait: the server's answer says more
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err(), true
		case <-t.C:
		}
	}
}

// wait returns how long to wait before retrying after f, and whether to
// retry at all.
func (c *Client) wait(f Failure, attempt int) (time.Duration, bool) {
	switch {
	case f.HasRetryInfo && (f.Code == CodeUnavailable || f.Code == CodeAborted):
		return max(f.RetryDelay, 0), f.RetryDelay <= maxRetryDelay
	case f.Code == CodeUnavailable:
		return c.cfg.backoff.jittered(attempt, mrand.Int64N), true
	}
	return 0, false
}

// backoff computes the client's waits: full jitter over a capped
// exponential.
type backoff struct {
	base, limit time.Duration
}

// jittered returns the wait before retry n (1 for the first retry), given a
// uniform random source over [0, n): a draw below min(limit, base·2ⁿ⁻¹).
// base·2ⁿ⁻¹ is at most limit exactly when base is at most limit>>(n-1), and
// then the shift does not overflow.
func (b backoff) jittered(retry int, rnd func(n int64) int64) time.Duration {
	ceil := b.limit
	if s := retry - 1; b.base <= b.limit>>s {
		ceil = b.base << s
	}
	if ceil <= 0 {
		return 0
	}
	return time.Duration(rnd(int64(ceil)))
}
