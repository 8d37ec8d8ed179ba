package idemecho_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemecho"
)

// app is an echo server with a request logger and middleware.Recover in
// front of idemecho.Middleware, and handlers that count their runs.
type app struct {
	echo    *echo.Echo
	runs    atomic.Int32
	release chan struct{} // closes to let /slow answer
	started chan struct{} // receives when /slow starts

	mu   sync.Mutex
	logs []middleware.RequestLoggerValues
}

func newApp(g *idem.Guard, opts ...idem.HTTPOption) *app {
	a := &app{release: make(chan struct{}), started: make(chan struct{}, 64)}
	e := echo.New()
	e.Logger.SetOutput(io.Discard)
	e.Use(middleware.RequestLoggerWithConfig(middleware.RequestLoggerConfig{
		LogStatus: true, LogError: true, HandleError: true,
		LogValuesFunc: func(_ echo.Context, v middleware.RequestLoggerValues) error {
			a.mu.Lock()
			defer a.mu.Unlock()
			a.logs = append(a.logs, v)
			return nil
		},
	}))
	e.Use(middleware.RecoverWithConfig(middleware.RecoverConfig{DisablePrintStack: true}))
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc { // authentication
		return func(c echo.Context) error {
			c.Set("account", c.Request().Header.Get("X-Account"))
			return next(c)
		}
	})
	p := e.Group("", idemecho.Middleware(g, opts...))
	p.POST("/payments/:id", func(c echo.Context) error {
		a.runs.Add(1)
		att, ok := idem.AttemptFrom(c.Request().Context())
		if !ok {
			return errors.New("no attempt")
		}
		body, _ := io.ReadAll(c.Request().Body)
		c.Response().Header().Set("Location", "/payments/"+c.Param("id"))
		c.Response().Header().Set("X-Trace", "t-1") // not on the stored allowlist
		return c.JSON(http.StatusCreated, map[string]any{"id": c.Param("id"), "fence": att.Fence, "body": string(body)})
	})
	p.POST("/fail/:how", func(c echo.Context) error {
		n := a.runs.Add(1)
		switch {
		case n > 1:
			return c.String(http.StatusAccepted, "accepted "+strconv.Itoa(int(n)))
		case c.Param("how") == "httperror":
			return echo.NewHTTPError(http.StatusInternalServerError, "database down")
		case c.Param("how") == "error":
			return errors.New("database down") // echo renders any error as 500
		default: // a 4xx error: a final answer, stored
			return echo.NewHTTPError(http.StatusBadRequest, "card declined")
		}
	})
	p.POST("/panic", func(c echo.Context) error {
		if a.runs.Add(1) == 1 {
			panic("boom")
		}
		return c.Blob(http.StatusCreated, "application/octet-stream", []byte{0, 1, 2})
	})
	p.POST("/slow", func(c echo.Context) error {
		a.runs.Add(1)
		a.started <- struct{}{}
		<-a.release
		return c.String(http.StatusCreated, "done")
	})
	p.POST("/empty", func(c echo.Context) error { a.runs.Add(1); return c.NoContent(http.StatusNoContent) })
	p.GET("/payments/:id", func(c echo.Context) error { a.runs.Add(1); return c.String(http.StatusOK, c.Param("id")) })
	a.echo = e
	return a
}

// send serves one request through echo; key "" sends no key.
func (a *app) send(method, path, key, body string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if key != "" {
		r.Header.Set(idem.DefaultKeyHeader, key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	a.echo.ServeHTTP(w, r)
	return w
}

// logged returns the statuses the request logger saw, and its errors.
func (a *app) logged() (statuses []int, errs []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, v := range a.logs {
		statuses = append(statuses, v.Status)
		if v.Error != nil {
			errs = append(errs, v.Error.Error())
		}
	}
	return statuses, errs
}

func TestReplay(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		a := newApp(b.Guard())
		first := a.send(http.MethodPost, "/payments/42", "k-1", `{"amount": 1000, "currency": "EUR"}`)
		require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
		require.JSONEq(t, `{"id":"42","fence":1,"body":"{\"amount\": 1000, \"currency\": \"EUR\"}"}`, first.Body.String())
		require.Equal(t, "/payments/42", first.Header().Get("Location"))
		require.Equal(t, "t-1", first.Header().Get("X-Trace"))
		require.Empty(t, first.Header().Get(idem.ReplayedHeader))

		again := a.send(http.MethodPost, "/payments/42", "k-1", `{"currency":"EUR","amount":1000}`)
		require.Equal(t, http.StatusCreated, again.Code)
		require.Equal(t, first.Body.String(), again.Body.String())
		require.Equal(t, "true", again.Header().Get(idem.ReplayedHeader))
		require.Equal(t, "/payments/42", again.Header().Get("Location"))
		require.Equal(t, first.Header().Get("Content-Type"), again.Header().Get("Content-Type"))
		require.Empty(t, again.Header().Get("X-Trace"), "only allowlisted headers are stored")
		require.Equal(t, int32(1), a.runs.Load())
		statuses, _ := a.logged()
		require.Equal(t, []int{201, 201}, statuses)
	})
}

func TestRefusals(t *testing.T) {
	tests := []struct {
		name   string
		key    string
		header []string // more request headers
		body   string
		opts   []idem.HTTPOption
		down   bool // the store is unreachable
		want   int
	}{
		{name: "key missing", want: http.StatusBadRequest},
		{name: "key invalid", key: strings.Repeat("k", 256), want: http.StatusBadRequest},
		{name: "key twice", key: "k-1", header: []string{idem.DefaultKeyHeader, "k-2"}, want: http.StatusBadRequest},
		{name: "body too large", key: "k-1", body: `{"amount": 123456789}`, opts: []idem.HTTPOption{idem.WithMaxRequestBody(8)}, want: http.StatusRequestEntityTooLarge},
		{name: "store unavailable", key: "k-1", down: true, want: http.StatusServiceUnavailable},
	}
	forEachBackend(t, func(t *testing.T, b *backend) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				b.Store.Down.Store(tt.down)
				defer b.Store.Down.Store(false)
				a := newApp(b.Guard(), tt.opts...)
				w := a.send(http.MethodPost, "/payments/1", tt.key, tt.body, tt.header...)
				require.Equal(t, tt.want, w.Code, w.Body.String())
				require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
				require.Contains(t, w.Body.String(), `"status":`+strconv.Itoa(tt.want))
				if tt.down {
					require.Equal(t, "1", w.Header().Get("Retry-After"))
				}
				require.Zero(t, a.runs.Load(), "the handler must not run")
				statuses, errs := a.logged()
				require.Equal(t, []int{tt.want}, statuses)
				require.Empty(t, errs)
			})
		}
	})
}

func TestMismatch(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		a := newApp(b.Guard())
		require.Equal(t, http.StatusCreated, a.send(http.MethodPost, "/payments/1", "k-1", `{"amount":1}`).Code)
		for _, path := range []string{"/payments/1", "/payments/2"} { // another body, another path parameter
			w := a.send(http.MethodPost, path, "k-1", `{"amount":2}`)
			require.Equal(t, http.StatusUnprocessableEntity, w.Code)
			require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
		}
		require.Equal(t, int32(1), a.runs.Load())
	})
}

func TestInProgress(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		a := newApp(b.Guard())
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- a.send(http.MethodPost, "/slow", "k-1", "{}") }()
		<-a.started

		w := a.send(http.MethodPost, "/slow", "k-1", "{}")
		require.Equal(t, http.StatusConflict, w.Code)
		retry, err := strconv.Atoi(w.Header().Get("Retry-After"))
		require.NoError(t, err)
		require.True(t, retry >= 1 && retry <= 30, "Retry-After %d: the lease's remaining seconds", retry)

		close(a.release)
		require.Equal(t, http.StatusCreated, (<-done).Code)
		w = a.send(http.MethodPost, "/slow", "k-1", "{}")
		require.Equal(t, http.StatusCreated, w.Code)
		require.Equal(t, "true", w.Header().Get(idem.ReplayedHeader))
		require.Equal(t, int32(1), a.runs.Load())
	})
}

// TestHandlerError: an error the handler returns is rendered by echo's
// error handler before the response is recorded. Rendered as 5xx it is
// released and the retry runs the handler again; rendered as 4xx it is the
// final answer, replayed as the client first saw it.
func TestHandlerError(t *testing.T) {
	tests := []struct {
		how      string
		first    int
		body     string
		released bool
	}{
		{how: "httperror", first: http.StatusInternalServerError, body: `{"message":"database down"}`, released: true},
		{how: "error", first: http.StatusInternalServerError, body: `{"message":"Internal Server Error"}`, released: true},
		{how: "declined", first: http.StatusBadRequest, body: `{"message":"card declined"}`},
	}
	forEachBackend(t, func(t *testing.T, b *backend) {
		for _, tt := range tests {
			t.Run(tt.how, func(t *testing.T) {
				a := newApp(b.Guard())
				w := a.send(http.MethodPost, "/fail/"+tt.how, "k-"+tt.how, "{}")
				require.Equal(t, tt.first, w.Code)
				require.JSONEq(t, tt.body, w.Body.String())
				_, errs := a.logged()
				require.Len(t, errs, 1, "the request logger sees the handler's error")

				w = a.send(http.MethodPost, "/fail/"+tt.how, "k-"+tt.how, "{}")
				if tt.released { // a fresh answer
					require.Empty(t, w.Header().Get(idem.ReplayedHeader))
					require.Equal(t, http.StatusAccepted, w.Code)
					require.Equal(t, "accepted 2", w.Body.String())
					require.Equal(t, int32(2), a.runs.Load())
					return
				}
				require.Equal(t, "true", w.Header().Get(idem.ReplayedHeader))
				require.Equal(t, tt.first, w.Code)
				require.JSONEq(t, tt.body, w.Body.String())
				require.Equal(t, "application/json", w.Header().Get("Content-Type"))
				require.Equal(t, int32(1), a.runs.Load())
			})
		}
	})
}

// TestPanic: middleware.Recover, in front of the middleware, answers the
// panic after idem released the key; the retry runs the handler again.
func TestPanic(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		a := newApp(b.Guard())
		require.Equal(t, http.StatusInternalServerError, a.send(http.MethodPost, "/panic", "k-1", "{}").Code)
		require.Equal(t, http.StatusCreated, a.send(http.MethodPost, "/panic", "k-1", "{}").Code)
		w := a.send(http.MethodPost, "/panic", "k-1", "{}")
		require.Equal(t, http.StatusCreated, w.Code)
		require.Equal(t, []byte{0, 1, 2}, w.Body.Bytes())
		require.Equal(t, "true", w.Header().Get(idem.ReplayedHeader))
		require.Equal(t, int32(2), a.runs.Load())
	})
}

func TestNoContent(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		a := newApp(b.Guard())
		require.Equal(t, http.StatusNoContent, a.send(http.MethodPost, "/empty", "k-1", "").Code)
		w := a.send(http.MethodPost, "/empty", "k-1", "")
		require.Equal(t, http.StatusNoContent, w.Code)
		require.Equal(t, "true", w.Header().Get(idem.ReplayedHeader))
		require.Equal(t, int32(1), a.runs.Load())
	})
}

func TestPassThrough(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		b.Store.Down.Store(true) // a safe method never reaches the store
		a := newApp(b.Guard())
		for range 2 {
			w := a.send(http.MethodGet, "/payments/7", "", "")
			require.Equal(t, http.StatusOK, w.Code)
			require.Equal(t, "7", w.Body.String())
		}
		require.Equal(t, int32(2), a.runs.Load())
	})
}

// TestScope: the scope function reads the account that an authentication
// middleware stored in the echo.Context; two accounts' equal keys never meet.
func TestScope(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		a := newApp(b.Guard(), idem.WithScope(func(r *http.Request) string {
			c, ok := idemecho.Context(r)
			if !ok {
				return ""
			}
			account, _ := c.Get("account").(string)
			return account
		}))
		for _, account := range []string{"acct-1", "acct-2", "acct-1"} {
			require.Equal(t, http.StatusCreated, a.send(http.MethodPost, "/payments/1", "k-1", "{}", "X-Account", account).Code)
		}
		require.Equal(t, int32(2), a.runs.Load())
	})
}

// TestParallelDuplicates: 32 duplicates at once run the handler once; with
// WithWait every one gets its answer.
func TestParallelDuplicates(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		a := newApp(b.Guard(idem.WithWait(10 * time.Second)))
		waiting := b.Store.Busy(31)
		go func() {
			<-a.started
			<-waiting // every duplicate was told to wait
			close(a.release)
		}()
		var wg sync.WaitGroup
		var replayed atomic.Int32
		codes := make(chan int, 32)
		for range 32 {
			wg.Go(func() {
				w := a.send(http.MethodPost, "/slow", "k-1", "{}")
				codes <- w.Code
				if w.Header().Get(idem.ReplayedHeader) == "true" && w.Body.String() == "done" {
					replayed.Add(1)
				}
			})
		}
		wg.Wait()
		close(codes)
		for code := range codes {
			require.Equal(t, http.StatusCreated, code)
		}
		require.Equal(t, int32(1), a.runs.Load())
		require.Equal(t, int32(31), replayed.Load())
	})
}
