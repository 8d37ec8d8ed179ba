package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync/atomic"

	"github.com/idemkit/idem"
)

// WatchBody wraps the body of the upstream's response to a request whose
// context is ctx: when reading it fails (the upstream broke off in the
// middle of its answer), it abandons the request's idem attempt, if any,
// since the upstream acted and its answer is lost. Use it where the body is
// read (httputil.ReverseProxy's ModifyResponse); the proxy then aborts the
// response (panics with http.ErrAbortHandler), and Aborted tells what to do
// with that panic.
func WatchBody(ctx context.Context, body io.ReadCloser) io.ReadCloser {
	if body == nil || body == http.NoBody {
		return body
	}
	return &watchedBody{ReadCloser: body, ctx: ctx}
}

type watchedBody struct {
	io.ReadCloser
	ctx    context.Context
	failed atomic.Bool
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && !b.failed.Swap(true) {
		if a, ok := idem.AttemptFrom(b.ctx); ok {
			a.Abandon()
		}
		if t := TrackerFrom(b.ctx); t != nil {
			t.bodyFailed.Store(true)
		}
		reportFrom(b.ctx).brokeOff()
	}
	return n, err
}

// Aborted handles the panic p that a reverse proxy raised in the handler
// of a request whose context is ctx, and reports whether to panic again
// (call it in a deferred function with recover()'s value; nil p reports
// false). A proxy aborts a response with http.ErrAbortHandler when copying
// the upstream's body failed:
//
//   - the upstream's body broke off (WatchBody saw it; the attempt is
//     abandoned): panic again, so that the client's connection is aborted
//     and the key stays in progress until its lease runs out;
//   - the upstream's body was read but the client could not be written to
//     (a response larger than the middleware stores, streamed to a client
//     that left): do not panic, so that the middleware records the status
//     and headers the upstream answered, as for any response too large to
//     store; the upstream acted, and a retry must not run it again.
//
// Any other panic is panicked again.
func Aborted(ctx context.Context, p any) (repanic bool) {
	if p == nil {
		return false
	}
	if err, ok := p.(error); !ok || !errors.Is(err, http.ErrAbortHandler) {
		return true
	}
	if _, keyed := idem.AttemptFrom(ctx); !keyed {
		return true
	}
	t := TrackerFrom(ctx)
	return t == nil || t.bodyFailed.Load()
}
