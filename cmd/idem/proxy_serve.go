package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// settleTimeout bounds the wait, after the grace period, for the requests
// it cut off: their contexts are cancelled, and each settles its key (a
// request not yet sent upstream releases it, one sent keeps it until its
// lease runs out) within idem's write timeout (5s).
const settleTimeout = 10 * time.Second

// newServer returns the server of the proxy's listener: header reads are
// bounded, bodies are streamed (the middleware bounds what it reads).
func newServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// shutdown is how serve ends the requests still running after the grace
// period.
type shutdown struct {
	running *inflight // the proxy's handler
	cut     func()    // cuts off the calls to the upstream
}

// serve serves each server on its listener (a nil listener: not served)
// until ctx ends or one fails, then shuts them down: the listeners stop
// accepting, in-flight requests may finish for up to grace (and so store
// their responses), then the calls to the upstream still running are cut
// off, the connections still open are closed, and serve waits up to
// settleTimeout for the requests cut off to settle their keys.
func serve(ctx context.Context, log *slog.Logger, grace time.Duration, sd shutdown, servers []*http.Server, lns []net.Listener) error {
	failed := make(chan error, len(servers))
	for i, s := range servers {
		if lns[i] == nil {
			continue
		}
		go func() { failed <- s.Serve(lns[i]) }()
	}
	var err error
	select {
	case <-ctx.Done():
		log.Info("idem proxy: shutting down; in-flight requests may finish", "event", "shutdown", "grace", grace.String())
	case err = <-failed:
		log.Error("idem proxy: a listener failed", "event", "listener_failed", "err", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	cut := false
	for i, s := range servers {
		if lns[i] == nil {
			continue
		}
		if serr := s.Shutdown(sctx); serr != nil {
			if !cut {
				sd.cut()
			}
			cut = true
			s.Close()
		}
	}
	if cut {
		log.Warn("idem proxy: requests still running at the end of the grace period were cut off; those not yet sent upstream release their keys, the others keep them until their lease runs out", "event", "shutdown_cut")
		if !sd.running.wait(settleTimeout) {
			log.Error("idem proxy: requests cut off did not end in time; their keys stay in progress until their lease runs out", "event", "settle_timeout", "wait", settleTimeout.String())
		}
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	if err == nil {
		log.Info("idem proxy: stopped", "event", "stop")
	}
	return err
}

// inflight is a handler that counts the requests it is serving, so that
// the proxy can wait for the ones it cut off at shutdown.
type inflight struct {
	next http.Handler
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0 while wait waits
}

// ServeHTTP implements http.Handler.
func (f *inflight) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.n++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		if f.n--; f.n == 0 && f.idle != nil {
			close(f.idle)
			f.idle = nil
		}
		f.mu.Unlock()
	}()
	f.next.ServeHTTP(w, r)
}

// wait waits until no request is being served, for up to d, and reports
// whether none is.
func (f *inflight) wait(d time.Duration) bool {
	f.mu.Lock()
	if f.n == 0 {
		f.mu.Unlock()
		return true
	}
	if f.idle == nil {
		f.idle = make(chan struct{})
	}
	idle := f.idle
	f.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-idle:
		return true
	case <-t.C:
		return false
	}
}
