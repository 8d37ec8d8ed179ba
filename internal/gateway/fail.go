package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"

	"github.com/idemkit/idem"
)

// problemBase is where the problem types are explained, as for the
// middleware's own problems.
const problemBase = "https://github.com/idemkit/idem/blob/main/docs/http.md#"

// Problem types of Fail's answers.
const (
	// ProblemUnreachable (502): the request was not sent to the upstream.
	ProblemUnreachable = problemBase + "upstream-unreachable"
	// ProblemFailed (502): the request was sent, no complete answer came back.
	ProblemFailed = problemBase + "upstream-failed"
	// ProblemTimeout (504): the request was sent, the answer did not come in time.
	ProblemTimeout = problemBase + "upstream-timeout"
)

// Verdict is what Fail did with the request's key.
type Verdict string

// Verdicts of Fail, stable: use them in logs and metrics.
const (
	// Released: the request was not sent; the attempt was released, so a
	// retry runs at once.
	Released Verdict = "released"
	// Abandoned: the request was sent and its outcome is not known; the
	// attempt was abandoned, so the key stays in progress until its lease
	// runs out, and the retry after that is the next attempt.
	Abandoned Verdict = "abandoned"
	// Unkeyed: the request was not under the middleware (passed through);
	// there was no key to settle.
	Unkeyed Verdict = "unkeyed"
)

// Failure describes Fail's answer.
type Failure struct {
	Status  int     // 502 or 504
	Type    string  // the problem type: ProblemUnreachable, ProblemFailed or ProblemTimeout
	Sent    bool    // the request was (or may have been) written to the upstream
	Verdict Verdict // what became of the key
}

// Fail answers a request whose call to the upstream failed with err, and
// settles its idem attempt (when the request runs under the middleware) by
// whether the request reached the upstream (the Tracker of Track or
// Prepare in r's context; without one, it may have):
//
//   - Not sent (a refused connection, a failed dial): 502 of type
//     upstream-unreachable, and the attempt is released
//     (idem.Attempt.Release), so the answer is never stored, even where
//     the middleware stores 5xx, and a retry runs at once.
//   - Sent, then no complete answer (the connection dropped, the response
//     timed out): 502 of type upstream-failed, or 504 of type
//     upstream-timeout when err is a timeout; the attempt is abandoned
//     (idem.Attempt.Abandon): the key is neither released nor completed,
//     so no retry reaches the upstream before the lease runs out, and the
//     first one after is the next attempt, which the upstream sees in
//     AttemptHeader.
//
// The answers are application/problem+json, as the middleware's, with
// Cache-Control: no-store. The context's Report, if any, notes the answer.
func Fail(w http.ResponseWriter, r *http.Request, err error) Failure {
	ctx := r.Context()
	f := Failure{Status: http.StatusBadGateway, Type: ProblemUnreachable, Sent: TrackerFrom(ctx).Wrote(), Verdict: Unkeyed}
	a, keyed := idem.AttemptFrom(ctx)
	if f.Sent {
		f.Type = ProblemFailed
		if isTimeout(err) {
			f.Status, f.Type = http.StatusGatewayTimeout, ProblemTimeout
		}
		if keyed {
			a.Abandon()
			f.Verdict = Abandoned
		}
	} else if keyed {
		a.Release()
		f.Verdict = Released
	}
	writeProblem(w, f, keyed)
	reportFrom(ctx).failed(f)
	return f
}

// isTimeout reports whether err is a timeout: a deadline, or a net.Error
// that says so (the transport's response header timeout).
func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// writeProblem answers with f's problem; keyed says whether the request
// carried an idempotency key, which the detail then speaks of.
func writeProblem(w http.ResponseWriter, f Failure, keyed bool) {
	p := problem{Type: f.Type, Status: f.Status}
	switch f.Type {
	case ProblemUnreachable:
		p.Title = "Upstream unreachable"
		p.Detail = "The service behind this gateway could not be reached; the request was not sent to it, so nothing was done. Retry later."
		if keyed {
			p.Detail = "The service behind this gateway could not be reached; the request was not sent to it, so nothing was done. Retry with the same key."
		}
	case ProblemFailed, ProblemTimeout:
		p.Title = "Upstream failed"
		what := "no complete response came back"
		if f.Type == ProblemTimeout {
			p.Title, what = "Upstream timed out", "its response did not come in time"
		}
		p.Detail = "The request was sent to the service behind this gateway, but " + what + ", so it is not known whether it was processed. Check its outcome before repeating it."
		if keyed {
			p.Detail = "The request was sent to the service behind this gateway, but " + what + ", so it is not known whether it was processed. Retry with the same key: until the first attempt's lease runs out, retries get 409 with Retry-After; after that, the retry is sent as the next attempt and the service can tell whether the first one happened."
		}
	}
	b, _ := json.Marshal(p) // strings and an int: cannot fail
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(f.Status)
	_, _ = w.Write(b)
}
