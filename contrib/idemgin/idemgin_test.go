package idemgin_test

import (
	"bytes"
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

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemgin"
)

func init() { gin.SetMode(gin.TestMode) }

// app is a gin engine with gin.Logger and gin.Recovery in front of
// idemgin.Middleware, and handlers that count their runs.
type app struct {
	engine  *gin.Engine
	runs    atomic.Int32
	after   atomic.Int32  // runs of a handler chained after the protected one's middleware
	release chan struct{} // closes to let /slow answer
	started chan struct{} // receives when /slow starts
	log     syncBuffer
}

func newApp(g *idem.Guard, opts ...idem.HTTPOption) *app {
	a := &app{release: make(chan struct{}), started: make(chan struct{}, 64)}
	e := gin.New()
	e.ContextWithFallback = true // so that idem.AttemptFrom(c) works too
	e.Use(gin.LoggerWithWriter(&a.log), gin.RecoveryWithWriter(&a.log))
	e.Use(func(c *gin.Context) { c.Set("account", c.GetHeader("X-Account")) }) // authentication
	p := e.Group("/", idemgin.Middleware(g, opts...), func(c *gin.Context) { a.after.Add(1) })
	p.POST("/payments/:id", func(c *gin.Context) {
		a.runs.Add(1)
		att, ok := idem.AttemptFrom(c.Request.Context())
		if viaGin, _ := idem.AttemptFrom(c); !ok || viaGin != att {
			c.String(http.StatusInternalServerError, "no attempt")
			return
		}
		body, _ := io.ReadAll(c.Request.Body)
		_ = c.Error(errors.New("audit note"))
		c.Header("Location", "/payments/"+c.Param("id"))
		c.Header("X-Trace", "t-1") // not on the stored allowlist
		c.JSON(http.StatusCreated, gin.H{"id": c.Param("id"), "fence": att.Fence, "body": string(body)})
	})
	p.POST("/flaky", func(c *gin.Context) {
		if a.runs.Add(1) == 1 {
			c.AbortWithStatusJSON(http.StatusServiceUnavailable, gin.H{"error": "try again"})
			return
		}
		c.String(http.StatusAccepted, "accepted %d", a.runs.Load())
	})
	p.POST("/panic", func(c *gin.Context) {
		if a.runs.Add(1) == 1 {
			panic("boom")
		}
		c.Data(http.StatusCreated, "application/octet-stream", []byte{0, 1, 2})
	})
	p.POST("/slow", func(c *gin.Context) {
		a.runs.Add(1)
		a.started <- struct{}{}
		<-a.release
		c.String(http.StatusCreated, "done")
	})
	p.POST("/empty", func(c *gin.Context) { a.runs.Add(1); c.Status(http.StatusNoContent) })
	p.GET("/payments/:id", func(c *gin.Context) { a.runs.Add(1); c.String(http.StatusOK, c.Param("id")) })
	a.engine = e
	return a
}

// send serves one request through the engine; key "" sends no key.
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
	a.engine.ServeHTTP(w, r)
	return w
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

		// A retry, its JSON re-serialised: the same request.
		again := a.send(http.MethodPost, "/payments/42", "k-1", `{"currency":"EUR","amount":1000}`)
		require.Equal(t, http.StatusCreated, again.Code)
		require.Equal(t, first.Body.String(), again.Body.String())
		require.Equal(t, "true", again.Header().Get(idem.ReplayedHeader))
		require.Equal(t, "/payments/42", again.Header().Get("Location"))
		require.Equal(t, first.Header().Get("Content-Type"), again.Header().Get("Content-Type"))
		require.Empty(t, again.Header().Get("X-Trace"), "only allowlisted headers are stored")
		require.Equal(t, int32(1), a.runs.Load())
		require.Equal(t, int32(1), a.after.Load(), "the chain is aborted on a replay")

		log := a.log.String()
		require.Equal(t, 2, strings.Count(log, "| 201 |"), log)
		require.Equal(t, 1, strings.Count(log, "Error #01: audit note"), log)
	})
}

func TestRefusals(t *testing.T) {
	long := strings.Repeat("k", 256)
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
		{name: "key invalid", key: long, want: http.StatusBadRequest},
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
				require.Zero(t, a.after.Load(), "the chain must be aborted")
				require.Contains(t, a.log.String(), "| "+strconv.Itoa(tt.want)+" |", "gin's logger sees idem's answer")
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
		require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))

		close(a.release)
		require.Equal(t, http.StatusCreated, (<-done).Code)
		w = a.send(http.MethodPost, "/slow", "k-1", "{}")
		require.Equal(t, http.StatusCreated, w.Code)
		require.Equal(t, "true", w.Header().Get(idem.ReplayedHeader))
		require.Equal(t, int32(1), a.runs.Load())
	})
}

// TestErrorReleased: a 5xx written by c.AbortWithStatusJSON is sent, not
// stored; the retry runs the handler again, and its answer is stored.
func TestErrorReleased(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		a := newApp(b.Guard())
		w := a.send(http.MethodPost, "/flaky", "k-1", "{}")
		require.Equal(t, http.StatusServiceUnavailable, w.Code)
		require.JSONEq(t, `{"error":"try again"}`, w.Body.String())
		w = a.send(http.MethodPost, "/flaky", "k-1", "{}")
		require.Equal(t, http.StatusAccepted, w.Code)
		require.Equal(t, "accepted 2", w.Body.String())
		w = a.send(http.MethodPost, "/flaky", "k-1", "{}")
		require.Equal(t, http.StatusAccepted, w.Code)
		require.Equal(t, "accepted 2", w.Body.String())
		require.Equal(t, "true", w.Header().Get(idem.ReplayedHeader))
		require.Equal(t, int32(2), a.runs.Load())
	})
}

// TestPanic: gin.Recovery, in front of the middleware, answers the panic
// after idem released the key; the retry runs the handler again.
func TestPanic(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		a := newApp(b.Guard())
		w := a.send(http.MethodPost, "/panic", "k-1", "{}")
		require.Equal(t, http.StatusInternalServerError, w.Code)
		w = a.send(http.MethodPost, "/panic", "k-1", "{}")
		require.Equal(t, http.StatusCreated, w.Code)
		w = a.send(http.MethodPost, "/panic", "k-1", "{}")
		require.Equal(t, http.StatusCreated, w.Code)
		require.Equal(t, []byte{0, 1, 2}, w.Body.Bytes())
		require.Equal(t, "application/octet-stream", w.Header().Get("Content-Type"))
		require.Equal(t, "true", w.Header().Get(idem.ReplayedHeader))
		require.Equal(t, int32(2), a.runs.Load())
	})
}

// TestStatusOnly: a handler that only sets a status (c.Status) has it
// recorded, as gin's engine would write it.
func TestStatusOnly(t *testing.T) {
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
		require.Equal(t, int32(2), a.after.Load())
	})
}

// TestScope: the scope function reads the account that an authentication
// middleware stored in the gin.Context; two accounts' equal keys never meet.
func TestScope(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		a := newApp(b.Guard(), idem.WithScope(func(r *http.Request) string {
			c, ok := idemgin.Context(r)
			if !ok {
				return ""
			}
			return c.GetString("account")
		}))
		for _, account := range []string{"acct-1", "acct-2", "acct-1"} {
			w := a.send(http.MethodPost, "/payments/1", "k-1", "{}", "X-Account", account)
			require.Equal(t, http.StatusCreated, w.Code)
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

// syncBuffer is a bytes.Buffer for concurrent writers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
