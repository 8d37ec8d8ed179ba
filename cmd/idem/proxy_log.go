package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/gateway"
)

// decision is what the log line of one request says; the Observer and
// the error handler fill it in.
type decision struct {
	event       *idem.Event
	failure     *gateway.Failure
	upstreamErr error
}

type decisionKey struct{}

func decisionFrom(ctx context.Context) *decision {
	d, _ := ctx.Value(decisionKey{}).(*decision)
	return d
}

// decisionObserver records each operation's event in the request's
// decision, for its log line.
type decisionObserver struct{}

func (decisionObserver) Start(ctx context.Context, _ idem.Kind) context.Context { return ctx }

func (decisionObserver) End(ctx context.Context, e idem.Event) {
	if d := decisionFrom(ctx); d != nil {
		d.event = &e
	}
}

// logged logs one line per request to lines, what was decided and
// answered: for every request, or (all false) for those that failed only.
type logged struct {
	next  http.Handler
	lines io.Writer
	all   bool
}

func (l *logged) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	d := &decision{}
	r = r.WithContext(context.WithValue(r.Context(), decisionKey{}, d))
	sw := &statusWriter{ResponseWriter: w}
	defer func() {
		// A response aborted (http.ErrAbortHandler) is logged, then
		// aborted as before.
		aborted := recover()
		failed := d.failure != nil || aborted != nil
		if !l.all && !failed {
			return
		}
		level := slog.LevelInfo
		if failed {
			level = slog.LevelWarn
		}
		now := time.Now()
		line := newRequestLine(now, level)
		line.str("method", r.Method)
		line.str("path", r.URL.Path)
		line.int("status", int64(sw.status()))
		line.duration("duration", now.Sub(start))
		if aborted != nil {
			line.bool("aborted", true)
			defer panic(aborted)
		}
		outcome := "pass"
		if e := d.event; e != nil {
			outcome = string(e.Outcome)
			line.str("id", e.ID)
			line.int("fence", e.Fence)
			if e.Wait > 0 {
				line.duration("wait", e.Wait)
			}
		}
		if f := d.failure; f != nil {
			line.str("upstream", "failed")
			line.bool("sent", f.Sent)
			line.str("key", string(f.Verdict))
			line.str("err", d.upstreamErr.Error())
		}
		line.str("outcome", outcome)
		line.writeTo(l.lines)
	}()
	l.next.ServeHTTP(sw, r)
}

// statusWriter notes the status sent.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 && code >= 200 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (flushes,
// upgrades of passed-through requests).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush implements http.Flusher, which the reverse proxy asks for.
func (w *statusWriter) Flush() {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *statusWriter) status() int {
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}
