package gateway

import (
	"context"
	"sync"
	"time"
)

// Report is what came of a request's calls to the upstream, for metrics:
// how long the upstream took, and how the gateway answered a failure.
// WithReport puts one in a request's context; Track (so Prepare), Fail and
// WatchBody fill in the Report they find in theirs. It is safe for
// concurrent use.
type Report struct {
	mu         sync.Mutex
	start, end time.Time // a connection first asked for; the first response byte, or the failure
	failure    *Failure
	bodyFailed bool
}

type reportKey struct{}

// WithReport returns a context that carries a new Report, and the Report.
// Give it to the request before the gateway's handlers see it (a metrics
// middleware in front of idem's).
func WithReport(ctx context.Context) (context.Context, *Report) {
	r := &Report{}
	return context.WithValue(ctx, reportKey{}, r), r
}

// reportFrom returns the Report of ctx, or nil.
func reportFrom(ctx context.Context) *Report {
	r, _ := ctx.Value(reportKey{}).(*Report)
	return r
}

// Upstream returns how long the upstream took: from the first connection
// the request asked for to the first byte of the upstream's response (its
// status line), or to the failure Fail answered. ok is false when the
// request was not sent upstream (a replay, a refusal), when its call has
// not ended, and on a nil Report.
func (r *Report) Upstream() (d time.Duration, ok bool) {
	if r == nil {
		return 0, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.start.IsZero() || r.end.IsZero() {
		return 0, false
	}
	return r.end.Sub(r.start), true
}

// Failure returns Fail's answer to the request's upstream failure; ok is
// false when Fail was not called, and on a nil Report.
func (r *Report) Failure() (f Failure, ok bool) {
	if r == nil {
		return Failure{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failure == nil {
		return Failure{}, false
	}
	return *r.failure, true
}

// BodyFailed reports whether reading the upstream's response body failed
// (WatchBody): the upstream answered, then broke off. A nil Report reports
// false.
func (r *Report) BodyFailed() bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bodyFailed
}

// began notes that the request asked for an upstream connection.
func (r *Report) began() {
	if r == nil {
		return
	}
	r.mu.Lock()
	if r.start.IsZero() {
		r.start = time.Now()
	}
	r.mu.Unlock()
}

// answered notes the first byte of the upstream's response.
func (r *Report) answered() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.end = time.Now()
	r.mu.Unlock()
}

// failed notes Fail's answer.
func (r *Report) failed(f Failure) {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.failure = &f
	if !r.start.IsZero() {
		r.end = time.Now()
	}
	r.mu.Unlock()
}

// brokeOff notes that the upstream's response body broke off.
func (r *Report) brokeOff() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.bodyFailed = true
	r.mu.Unlock()
}
