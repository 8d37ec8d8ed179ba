package idemclient

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idem/internal/wire"
)

// How the transport decides whether, and after how long, to send a request
// again.

const (
	// maxDrain is how much of a retried response's body is read so that its
	// connection can be reused.
	maxDrain = 64 << 10
	// maxProblemPeek is how much of a 409's body is read to tell idem's
	// in-progress problem (about 300 bytes) from a handler's own 409.
	maxProblemPeek = 4 << 10
	// maxRetryAfterSeconds is the largest delay-seconds a time.Duration holds.
	maxRetryAfterSeconds = math.MaxInt64 / int64(time.Second)
)

// retryWait reports whether the outcome of attempt number attempt is retried,
// and after how long. A retried response's body is drained and closed; a
// response that is not retried is left to the caller with its body intact.
func (t *transport) retryWait(resp *http.Response, err error, attempt int) (time.Duration, bool) {
	if err != nil {
		return t.backoffFor(attempt), true
	}
	if resp == nil { // a base breaking the RoundTripper contract: the caller's http.Client reports it
		return 0, false
	}
	switch resp.StatusCode {
	case http.StatusConflict:
		if !isInProgress(resp) {
			return 0, false
		}
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
	default:
		return 0, false
	}
	wait, ok := retryAfter(resp.Header.Get("Retry-After"), t.now())
	switch {
	case !ok:
		wait = t.backoffFor(attempt)
	case wait > t.maxRetryAfter:
		return 0, false
	}
	_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
	resp.Body.Close()
	return wait, true
}

// isInProgress reports whether resp, a 409, is idem's answer to a duplicate
// of a request that is still running: a problem (RFC 9457) whose type is the
// middleware's in-progress type. It reads at most maxProblemPeek bytes of the
// body to decide, and puts them back in front of the rest.
func isInProgress(resp *http.Response) bool {
	mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err != nil || mt != wire.ProblemContentType {
		return false
	}
	body := resp.Body
	prefix, err := io.ReadAll(io.LimitReader(body, maxProblemPeek+1))
	rest := io.Reader(body)
	if err != nil {
		rest = errReader{err}
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(prefix), rest), body}
	if err != nil || len(prefix) > maxProblemPeek {
		return false
	}
	var p struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(prefix, &p) == nil && p.Type == wire.InProgressProblem
}

// errReader fails every read with its error.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// backoffFor returns the full-jitter backoff before retry number attempt:
// uniform in [0, min(cap, base·2^(attempt-1))).
func (t *transport) backoffFor(attempt int) time.Duration {
	limit := t.backoffCap
	if shift := attempt - 1; shift < 32 && t.backoff<<shift < limit && t.backoff<<shift > 0 {
		limit = t.backoff << shift
	}
	if limit <= 0 {
		return 0
	}
	return time.Duration(t.jitter(int64(limit)))
}

// retryAfter parses a Retry-After value: delay-seconds or an HTTP date. A
// number of seconds too large for a time.Duration, or a date too far ahead,
// gives the largest Duration.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if digits(v) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n > maxRetryAfterSeconds { // only ErrRange: v is digits
			return math.MaxInt64, true
		}
		return time.Duration(n) * time.Second, true
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(at.Sub(now), 0), true // Sub saturates
	}
	return 0, false
}

// digits reports whether s is one or more ASCII digits.
func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// sleepCtx sleeps for d or until ctx ends, returning the context's error.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
