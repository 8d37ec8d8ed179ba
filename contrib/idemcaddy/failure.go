package idemcaddy

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/idemkit/idem"
)

// AttemptHeader carries the attempt's fence to the upstream.
const AttemptHeader = "Idempotency-Attempt"

// stripAttempt removes a client-sent Idempotency-Attempt.
func stripAttempt(r *http.Request) { r.Header.Del(AttemptHeader) }

// setAttempt tells the upstream which attempt this is.
func setAttempt(r *http.Request, a *idem.Attempt) {
	r.Header.Set(AttemptHeader, strconv.FormatInt(a.Fence, 10))
}

// trackSent returns r with a trace that notes when its headers were
// written to an upstream, and the function that reports it.
func trackSent(r *http.Request) (*http.Request, func() bool) {
	var sent atomic.Bool
	t := &httptrace.ClientTrace{WroteHeaders: func() { sent.Store(true) }}
	return r.WithContext(httptrace.WithClientTrace(r.Context(), t)), sent.Load
}

// statusWriter notes whether the response was started.
type statusWriter struct {
	http.ResponseWriter
	wrote bool
}

func (w *statusWriter) WriteHeader(code int) {
	if code >= 200 || code == http.StatusSwitchingProtocols {
		w.wrote = true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Flush implements http.Flusher.
func (w *statusWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

// Unwrap is for http.ResponseController.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// answerFailure answers a keyed request whose route returned err.
func answerFailure(w *statusWriter, r *http.Request, a *idem.Attempt, err error, sent bool) {
	if w.wrote { // the answer had begun: it cannot be told apart from a complete one
		a.Abandon()
		return
	}
	status := http.StatusInternalServerError
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode != 0 {
		status = he.StatusCode
	}
	if sent {
		a.Abandon()
		if status != http.StatusGatewayTimeout {
			status = http.StatusBadGateway
		}
	}
	writeProblem(w, status, err)
}

func writeProblem(w http.ResponseWriter, status int, err error) {
	b, _ := json.Marshal(map[string]any{"status": status, "title": http.StatusText(status), "detail": err.Error()})
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
