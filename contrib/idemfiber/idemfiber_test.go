package idemfiber_test

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

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/recover"
	"github.com/gofiber/fiber/v2/middleware/requestid"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemfiber"
)

// app is a fiber app with recover and requestid in front of idemfiber.New,
// and handlers that count their runs.
type app struct {
	fiber   *fiber.App
	runs    atomic.Int32
	release chan struct{} // closes to let /slow answer
	started chan struct{} // receives when /slow starts
}

// streamed is the body /stream sends as a stream, larger than fasthttp's
// copy buffer.
var streamed = bytes.Repeat([]byte("0123456789abcdef"), 8<<10)

func newApp(g *idem.Guard, opts ...idem.HTTPOption) *app {
	a := &app{release: make(chan struct{}), started: make(chan struct{}, 64)}
	f := fiber.New()
	f.Use(recover.New(), requestid.New())
	f.Use(func(c *fiber.Ctx) error { // authentication
		c.Locals("account", c.Get("X-Account"))
		return c.Next()
	})
	f.Use(idemfiber.New(g, opts...))
	f.Post("/payments/:id", func(c *fiber.Ctx) error {
		a.runs.Add(1)
		att, ok := idem.AttemptFrom(c.UserContext())
		if !ok {
			return errors.New("no attempt")
		}
		c.Location("/payments/" + c.Params("id"))
		c.Set("X-Trace", "t-1") // not on the stored allowlist
		return c.Status(fiber.StatusCreated).JSON(fiber.Map{"id": c.Params("id"), "fence": att.Fence, "body": string(c.Body())})
	})
	f.Post("/fail/:how", func(c *fiber.Ctx) error {
		n := a.runs.Add(1)
		switch {
		case n > 1:
			return c.Status(fiber.StatusAccepted).SendString("accepted " + strconv.Itoa(int(n)))
		case c.Params("how") == "fibererror":
			return fiber.NewError(fiber.StatusInternalServerError, "database down")
		case c.Params("how") == "error":
			return errors.New("database down") // rendered as 500
		default: // a 4xx error: a final answer, stored
			return fiber.NewError(fiber.StatusBadRequest, "card declined")
		}
	})
	f.Post("/panic", func(c *fiber.Ctx) error {
		if a.runs.Add(1) == 1 {
			c.Location("/never-sent")
			panic("boom")
		}
		c.Type("bin")
		return c.Status(fiber.StatusCreated).Send([]byte{0, 1, 2})
	})
	f.Post("/slow", func(c *fiber.Ctx) error {
		a.runs.Add(1)
		a.started <- struct{}{}
		<-a.release
		return c.Status(fiber.StatusCreated).SendString("done")
	})
	f.Post("/stream/:how", func(c *fiber.Ctx) error {
		var r io.Reader = bytes.NewReader(streamed)
		if a.runs.Add(1) == 1 && c.Params("how") == "broken" {
			r = io.MultiReader(bytes.NewReader(streamed[:1000]), errReader{})
		}
		c.Type("txt")
		return c.Status(fiber.StatusCreated).SendStream(r) // size unknown: chunked
	})
	f.Post("/empty", func(c *fiber.Ctx) error { a.runs.Add(1); return c.SendStatus(fiber.StatusNoContent) })
	f.Get("/payments/:id", func(c *fiber.Ctx) error { a.runs.Add(1); return c.SendString(c.Params("id")) })
	a.fiber = f
	return a
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("disk gone") }

// response is what a client received.
type response struct {
	code   int
	header http.Header
	body   string
}

// send serves one request through fiber; key "" sends no key.
func (a *app) send(t *testing.T, method, path, key, body string, header ...string) response {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if key != "" {
		r.Header.Set(idem.DefaultKeyHeader, key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	resp, err := a.fiber.Test(r, -1)
	if err != nil {
		t.Error(err) // not Fatal: send runs in goroutines too
		return response{}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Error(err)
	}
	return response{resp.StatusCode, resp.Header, string(b)}
}

func TestReplay(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		a := newApp(b.Guard())
		first := a.send(t, fiber.MethodPost, "/payments/42", "k-1", `{"amount": 1000, "currency": "EUR"}`)
		require.Equal(t, http.StatusCreated, first.code, first.body)
		require.JSONEq(t, `{"id":"42","fence":1,"body":"{\"amount\": 1000, \"currency\": \"EUR\"}"}`, first.body)
		require.Equal(t, "/payments/42", first.header.Get("Location"))
		require.Equal(t, "t-1", first.header.Get("X-Trace"))
		require.Empty(t, first.header.Get(idem.ReplayedHeader))

		again := a.send(t, fiber.MethodPost, "/payments/42", "k-1", `{"currency":"EUR","amount":1000}`)
		require.Equal(t, http.StatusCreated, again.code)
		require.Equal(t, first.body, again.body)
		require.Equal(t, "true", again.header.Get(idem.ReplayedHeader))
		require.Equal(t, "/payments/42", again.header.Get("Location"))
		require.Equal(t, "application/json", again.header.Get("Content-Type"))
		require.Empty(t, again.header.Get("X-Trace"), "only allowlisted headers are stored")
		require.NotEmpty(t, again.header.Get("X-Request-Id"), "headers set in front are kept")
		require.NotEqual(t, first.header.Get("X-Request-Id"), again.header.Get("X-Request-Id"))
		require.Equal(t, int32(1), a.runs.Load())
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
		{name: "key twice, equal", key: "k-1", header: []string{idem.DefaultKeyHeader, "k-1"}, want: http.StatusBadRequest},
		{name: "body too large", key: "k-1", body: `{"amount": 123456789}`, opts: []idem.HTTPOption{idem.WithMaxRequestBody(8)}, want: http.StatusRequestEntityTooLarge},
		{name: "store unavailable", key: "k-1", down: true, want: http.StatusServiceUnavailable},
	}
	forEachBackend(t, func(t *testing.T, b *backend) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				b.Store.Down.Store(tt.down)
				defer b.Store.Down.Store(false)
				a := newApp(b.Guard(), tt.opts...)
				w := a.send(t, fiber.MethodPost, "/payments/1", tt.key, tt.body, tt.header...)
				require.Equal(t, tt.want, w.code, w.body)
				require.Equal(t, "application/problem+json", w.header.Get("Content-Type"))
				require.Contains(t, w.body, `"status":`+strconv.Itoa(tt.want))
				require.NotEmpty(t, w.header.Get("X-Request-Id"), "headers set in front are kept")
				if tt.down {
					require.Equal(t, "1", w.header.Get("Retry-After"))
				}
				require.Zero(t, a.runs.Load(), "the handler must not run")
			})
		}
	})
}

func TestMismatch(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		a := newApp(b.Guard())
		require.Equal(t, http.StatusCreated, a.send(t, fiber.MethodPost, "/payments/1", "k-1", `{"amount":1}`).code)
		for _, path := range []string{"/payments/1", "/payments/2", "/payments/1?x=1"} {
			w := a.send(t, fiber.MethodPost, path, "k-1", `{"amount":2}`)
			require.Equal(t, http.StatusUnprocessableEntity, w.code, path)
			require.Equal(t, "application/problem+json", w.header.Get("Content-Type"))
		}
		w := a.send(t, fiber.MethodPost, "/payments/1?x=1", "k-1", `{"amount":1}`)
		require.Equal(t, http.StatusUnprocessableEntity, w.code, "the query is part of the request")
		require.Equal(t, int32(1), a.runs.Load())
	})
}

func TestInProgress(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		a := newApp(b.Guard())
		done := make(chan response)
		go func() { done <- a.send(t, fiber.MethodPost, "/slow", "k-1", "{}") }()
		<-a.started

		w := a.send(t, fiber.MethodPost, "/slow", "k-1", "{}")
		require.Equal(t, http.StatusConflict, w.code)
		retry, err := strconv.Atoi(w.header.Get("Retry-After"))
		require.NoError(t, err)
		require.True(t, retry >= 1 && retry <= 30, "Retry-After %d: the lease's remaining seconds", retry)

		close(a.release)
		require.Equal(t, http.StatusCreated, (<-done).code)
		w = a.send(t, fiber.MethodPost, "/slow", "k-1", "{}")
		require.Equal(t, http.StatusCreated, w.code)
		require.Equal(t, "true", w.header.Get(idem.ReplayedHeader))
		require.Equal(t, int32(1), a.runs.Load())
	})
}

// TestHandlerError: an error the handlers return is rendered by the app's
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
		{how: "fibererror", first: http.StatusInternalServerError, body: "database down", released: true},
		{how: "error", first: http.StatusInternalServerError, body: "database down", released: true},
		{how: "declined", first: http.StatusBadRequest, body: "card declined"},
	}
	forEachBackend(t, func(t *testing.T, b *backend) {
		for _, tt := range tests {
			t.Run(tt.how, func(t *testing.T) {
				a := newApp(b.Guard())
				w := a.send(t, fiber.MethodPost, "/fail/"+tt.how, "k-"+tt.how, "{}")
				require.Equal(t, tt.first, w.code)
				require.Equal(t, tt.body, w.body)

				w = a.send(t, fiber.MethodPost, "/fail/"+tt.how, "k-"+tt.how, "{}")
				if tt.released { // a fresh answer
					require.Empty(t, w.header.Get(idem.ReplayedHeader))
					require.Equal(t, http.StatusAccepted, w.code)
					require.Equal(t, "accepted 2", w.body)
					require.Equal(t, int32(2), a.runs.Load())
					return
				}
				require.Equal(t, "true", w.header.Get(idem.ReplayedHeader))
				require.Equal(t, tt.first, w.code)
				require.Equal(t, tt.body, w.body)
				require.Equal(t, "text/plain; charset=utf-8", w.header.Get("Content-Type"))
				require.Equal(t, int32(1), a.runs.Load())
			})
		}
	})
}

// TestPanic: fiber's recover middleware, in front of New, answers the panic
// after idem released the key, without what the handler had set; the retry
// runs the handler again.
func TestPanic(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		a := newApp(b.Guard())
		w := a.send(t, fiber.MethodPost, "/panic", "k-1", "{}")
		require.Equal(t, http.StatusInternalServerError, w.code)
		require.Equal(t, "boom", w.body)
		require.Empty(t, w.header.Get("Location"))
		require.Equal(t, http.StatusCreated, a.send(t, fiber.MethodPost, "/panic", "k-1", "{}").code)
		w = a.send(t, fiber.MethodPost, "/panic", "k-1", "{}")
		require.Equal(t, http.StatusCreated, w.code)
		require.Equal(t, "\x00\x01\x02", w.body)
		require.Equal(t, "application/octet-stream", w.header.Get("Content-Type"))
		require.Equal(t, "true", w.header.Get(idem.ReplayedHeader))
		require.Equal(t, int32(2), a.runs.Load())
	})
}

// TestBodyStream: a body sent as a stream is recorded in full; a stream that
// fails is answered with a 500 naming the failure and the key is released.
func TestBodyStream(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		a := newApp(b.Guard())
		for i := range 2 {
			w := a.send(t, fiber.MethodPost, "/stream/ok", "k-1", "{}")
			require.Equal(t, http.StatusCreated, w.code)
			require.Equal(t, string(streamed), w.body)
			require.Equal(t, []string{"", "true"}[i], w.header.Get(idem.ReplayedHeader))
		}
		require.Equal(t, int32(1), a.runs.Load())

		// Larger than WithMaxResponseBody: sent once in full, not stored.
		a = newApp(b.Guard(), idem.WithMaxResponseBody(1024))
		w := a.send(t, fiber.MethodPost, "/stream/ok", "k-3", "{}")
		require.Equal(t, http.StatusCreated, w.code)
		require.Equal(t, string(streamed), w.body)
		w = a.send(t, fiber.MethodPost, "/stream/ok", "k-3", "{}")
		require.Equal(t, http.StatusCreated, w.code)
		require.Equal(t, "true", w.header.Get(idem.ReplayedHeader))
		require.Equal(t, "application/problem+json", w.header.Get("Content-Type"), "a problem saying it was not stored")
		require.Equal(t, int32(1), a.runs.Load())

		a = newApp(b.Guard())
		w = a.send(t, fiber.MethodPost, "/stream/broken", "k-2", "{}")
		require.Equal(t, http.StatusInternalServerError, w.code)
		require.Contains(t, w.body, idemfiber.ErrBodyStream.Error())
		require.Contains(t, w.body, "disk gone")
		w = a.send(t, fiber.MethodPost, "/stream/broken", "k-2", "{}")
		require.Equal(t, http.StatusCreated, w.code, "released: the retry runs again")
		require.Equal(t, string(streamed), w.body)
		require.Equal(t, int32(2), a.runs.Load())
	})
}

func TestNoContent(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		a := newApp(b.Guard())
		require.Equal(t, http.StatusNoContent, a.send(t, fiber.MethodPost, "/empty", "k-1", "").code)
		w := a.send(t, fiber.MethodPost, "/empty", "k-1", "")
		require.Equal(t, http.StatusNoContent, w.code)
		require.Equal(t, "true", w.header.Get(idem.ReplayedHeader))
		require.Equal(t, int32(1), a.runs.Load())
	})
}

func TestPassThrough(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		b.Store.Down.Store(true) // a safe method never reaches the store
		a := newApp(b.Guard())
		for range 2 {
			w := a.send(t, fiber.MethodGet, "/payments/7", "", "")
			require.Equal(t, http.StatusOK, w.code)
			require.Equal(t, "7", w.body)
		}
		require.Equal(t, int32(2), a.runs.Load())
		// A method that idem is not configured for passes through too,
		// with the handler's error rendered by fiber as usual.
		a = newApp(b.Guard(), idem.WithMethods(fiber.MethodPatch))
		w := a.send(t, fiber.MethodPost, "/fail/fibererror", "", "")
		require.Equal(t, http.StatusInternalServerError, w.code)
		require.Equal(t, "database down", w.body)
	})
}

// TestScope: the scope function reads the account that an authentication
// middleware stored in the fiber.Ctx; two accounts' equal keys never meet.
func TestScope(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		a := newApp(b.Guard(), idem.WithScope(func(r *http.Request) string {
			c, ok := idemfiber.Ctx(r)
			if !ok {
				return ""
			}
			account, _ := c.Locals("account").(string)
			return account
		}))
		for _, account := range []string{"acct-1", "acct-2", "acct-1"} {
			require.Equal(t, http.StatusCreated, a.send(t, fiber.MethodPost, "/payments/1", "k-1", "{}", "X-Account", account).code)
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
				w := a.send(t, fiber.MethodPost, "/slow", "k-1", "{}")
				codes <- w.code
				if w.header.Get(idem.ReplayedHeader) == "true" && w.body == "done" {
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
