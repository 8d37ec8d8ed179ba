package idemclient

import (
	"context"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/wire"
)

func TestNewKey(t *testing.T) {
	uuid4 := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := make(map[string]bool)
	for range 1000 {
		k := NewKey()
		require.Regexp(t, uuid4, k)
		require.NoError(t, wire.ValidKey(k))
		require.False(t, seen[k])
		seen[k] = true
	}
}

// scripted is a base RoundTripper that answers from a script and records
// what it was sent.
type scripted struct {
	mu     sync.Mutex
	script []func() (*http.Response, error)
	keys   []string
	bodies []string
}

func (s *scripted) RoundTrip(r *http.Request) (*http.Response, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var body string
	if r.Body != nil {
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		body = string(b)
	}
	s.keys = append(s.keys, r.Header.Get("Idempotency-Key"))
	s.bodies = append(s.bodies, body)
	step := s.script[min(len(s.keys), len(s.script))-1]
	return step()
}

func status(code int, header ...string) func() (*http.Response, error) {
	return func() (*http.Response, error) {
		h := http.Header{}
		for i := 0; i+1 < len(header); i += 2 {
			h.Set(header[i], header[i+1])
		}
		return &http.Response{StatusCode: code, Header: h, Body: io.NopCloser(strings.NewReader(http.StatusText(code)))}, nil
	}
}

func netErr() (*http.Response, error) { return nil, errors.New("read tcp: connection reset by peer") }

var clock = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

// testTransport returns a transport over base whose sleeps are recorded
// instead of slept, whose clock stands still and whose jitter is maximal.
func testTransport(base http.RoundTripper, opts ...Option) (*transport, *[]time.Duration) {
	t := NewTransport(base, opts...).(*transport)
	var slept []time.Duration
	t.sleep = func(ctx context.Context, d time.Duration) error {
		slept = append(slept, d)
		return ctx.Err()
	}
	t.now = func() time.Time { return clock }
	t.jitter = func(n int64) int64 { return n - 1 }
	return t, &slept
}

func postRequest(t *testing.T, ctx context.Context, body string) *http.Request {
	t.Helper()
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://api.test/payments", strings.NewReader(body))
	require.NoError(t, err)
	return r
}

func TestTransportKeys(t *testing.T) {
	ok := []func() (*http.Response, error){status(201)}
	t.Run("from WithKey, as an RFC 8941 string", func(t *testing.T) {
		base := &scripted{script: ok}
		tr, _ := testTransport(base)
		_, err := tr.RoundTrip(postRequest(t, WithKey(context.Background(), `order-"42"`), "x"))
		require.NoError(t, err)
		require.Equal(t, `"order-\"42\""`, base.keys[0])
	})
	t.Run("the request's own header wins", func(t *testing.T) {
		base := &scripted{script: ok}
		tr, _ := testTransport(base)
		r := postRequest(t, WithKey(context.Background(), "ctx"), "x")
		r.Header.Set("Idempotency-Key", "mine")
		_, err := tr.RoundTrip(r)
		require.NoError(t, err)
		require.Equal(t, "mine", base.keys[0])
	})
	t.Run("a new key for every logical request", func(t *testing.T) {
		base := &scripted{script: ok}
		tr, _ := testTransport(base)
		for range 2 {
			_, err := tr.RoundTrip(postRequest(t, context.Background(), "x"))
			require.NoError(t, err)
		}
		require.NotEqual(t, base.keys[0], base.keys[1])
	})
	t.Run("an invalid key is an error, nothing is sent", func(t *testing.T) {
		base := &scripted{script: ok}
		tr, _ := testTransport(base)
		_, err := tr.RoundTrip(postRequest(t, WithKey(context.Background(), "caf\u00e9"), "x"))
		require.ErrorIs(t, err, ErrInvalidKey)
		require.Empty(t, base.keys)
	})
	t.Run("an invalid key closes the body, as a RoundTripper must on errors", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			ctx  context.Context
			opts []Option
		}{
			{"invalid", WithKey(context.Background(), "caf\u00e9"), nil},
			{"cannot travel bare", WithKey(context.Background(), " padded"), []Option{WithBareKey()}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				tr, _ := testTransport(&scripted{script: ok}, tc.opts...)
				body := &closeCounter{Reader: strings.NewReader("x")}
				r := postRequest(t, tc.ctx, "")
				r.Body = body
				_, err := tr.RoundTrip(r)
				require.ErrorIs(t, err, ErrInvalidKey)
				require.Equal(t, 1, body.closed)

				r.Body = nil // no body to close: the same error
				_, err = tr.RoundTrip(r)
				require.ErrorIs(t, err, ErrInvalidKey)
			})
		}
	})
	t.Run("header name", func(t *testing.T) {
		var got http.Header
		tr := NewTransport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
			got = r.Header
			return status(201)()
		}), WithKeyHeader("x-request-key"))
		_, err := tr.RoundTrip(postRequest(t, context.Background(), "x"))
		require.NoError(t, err)
		require.NotEmpty(t, got.Get("X-Request-Key"))
		require.Empty(t, got.Get("Idempotency-Key"))
	})
}

// closeCounter is a request body that counts its Close calls.
type closeCounter struct {
	io.Reader
	closed int
}

func (c *closeCounter) Close() error {
	c.closed++
	return nil
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestTransportMethods(t *testing.T) {
	for _, tc := range []struct {
		method string
		opts   []Option
		keyed  bool
	}{
		{"POST", nil, true},
		{"PATCH", nil, true},
		{"PUT", nil, false},
		{"GET", nil, false},
		{"PUT", []Option{WithRetryMethods("PUT")}, true},
		{"POST", []Option{WithRetryMethods("PUT")}, false},
	} {
		base := &scripted{script: []func() (*http.Response, error){status(503), status(201)}}
		tr, _ := testTransport(base, tc.opts...)
		r, err := http.NewRequest(tc.method, "http://api.test/", nil)
		require.NoError(t, err)
		resp, err := tr.RoundTrip(r)
		require.NoError(t, err)
		if tc.keyed {
			require.Equal(t, 201, resp.StatusCode, tc.method)
			require.Len(t, base.keys, 2)
			require.NotEmpty(t, base.keys[0])
		} else {
			require.Equal(t, 503, resp.StatusCode, "%s passes through", tc.method)
			require.Equal(t, []string{""}, base.keys)
		}
	}
}

func TestTransportBodies(t *testing.T) {
	retry := []func() (*http.Response, error){status(503), status(201)}
	t.Run("without GetBody, buffered", func(t *testing.T) {
		base := &scripted{script: retry}
		tr, _ := testTransport(base)
		r := postRequest(t, context.Background(), "")
		r.Body, r.GetBody, r.ContentLength = io.NopCloser(io.MultiReader(strings.NewReader("hello"))), nil, -1
		resp, err := tr.RoundTrip(r)
		require.NoError(t, err)
		require.Equal(t, 201, resp.StatusCode)
		require.Equal(t, []string{"hello", "hello"}, base.bodies)
	})
	t.Run("without GetBody, exactly 1 MiB: buffered", func(t *testing.T) {
		base := &scripted{script: retry}
		tr, _ := testTransport(base)
		limit := strings.Repeat("x", maxBufferedBody)
		r := postRequest(t, context.Background(), "")
		r.Body, r.GetBody, r.ContentLength = io.NopCloser(strings.NewReader(limit)), nil, -1
		resp, err := tr.RoundTrip(r)
		require.NoError(t, err)
		require.Equal(t, 201, resp.StatusCode)
		require.Equal(t, []string{limit, limit}, base.bodies)
	})
	t.Run("without GetBody, too large to buffer: sent once", func(t *testing.T) {
		base := &scripted{script: retry}
		tr, _ := testTransport(base)
		big := strings.Repeat("x", maxBufferedBody+10)
		r := postRequest(t, context.Background(), "")
		r.Body, r.GetBody, r.ContentLength = io.NopCloser(io.MultiReader(strings.NewReader(big))), nil, -1
		resp, err := tr.RoundTrip(r)
		require.NoError(t, err)
		require.Equal(t, 503, resp.StatusCode)
		require.Equal(t, []string{big}, base.bodies)
	})
	t.Run("no body", func(t *testing.T) {
		base := &scripted{script: retry}
		tr, _ := testTransport(base)
		r, err := http.NewRequest(http.MethodPost, "http://api.test/", nil)
		require.NoError(t, err)
		resp, err := tr.RoundTrip(r)
		require.NoError(t, err)
		require.Equal(t, 201, resp.StatusCode)
		require.Equal(t, []string{"", ""}, base.bodies)
	})
}

func TestTransportShowsItsKey(t *testing.T) {
	t.Run("on the request sent and in the response", func(t *testing.T) {
		base := &scripted{script: []func() (*http.Response, error){status(503), status(201)}}
		tr, _ := testTransport(base)
		req := postRequest(t, context.Background(), "x")
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, 201, resp.StatusCode)
		require.NotNil(t, resp.Request, "a base that leaves Request nil")
		require.Equal(t, base.keys[0], resp.Request.Header.Get("Idempotency-Key"))
		require.Equal(t, base.keys[0], base.keys[1])
		require.Empty(t, req.Header.Get("Idempotency-Key"), "the caller's request is not changed")
		key, err := wire.ParseKey(resp.Request.Header.Get("Idempotency-Key"))
		require.NoError(t, err)

		// Reused as the header of a later request: the same key, as it is.
		resp, err = tr.RoundTrip(postRequest(t, WithKey(context.Background(), key), "x"))
		require.NoError(t, err)
		require.Equal(t, base.keys[0], base.keys[2])
		require.Equal(t, base.keys[0], resp.Request.Header.Get("Idempotency-Key"))
	})
	t.Run("a base that sets Request keeps it", func(t *testing.T) {
		var sent *http.Request
		tr := NewTransport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
			sent = r
			resp, err := status(201)()
			resp.Request = r
			return resp, err
		}))
		resp, err := tr.RoundTrip(postRequest(t, context.Background(), "x"))
		require.NoError(t, err)
		require.Same(t, sent, resp.Request)
		require.NotEmpty(t, resp.Request.Header.Get("Idempotency-Key"))
	})
	t.Run("the request's own header is kept", func(t *testing.T) {
		base := &scripted{script: []func() (*http.Response, error){status(503), status(201)}}
		tr, _ := testTransport(base)
		r := postRequest(t, context.Background(), "x")
		r.Header.Set("Idempotency-Key", "mine")
		resp, err := tr.RoundTrip(r)
		require.NoError(t, err)
		require.Equal(t, []string{"mine", "mine"}, base.keys)
		require.Equal(t, "mine", resp.Request.Header.Get("Idempotency-Key"))
	})
	t.Run("KeyFrom the response names the key sent: the header's, not the context's", func(t *testing.T) {
		tr, _ := testTransport(&scripted{script: []func() (*http.Response, error){status(201)}})
		r := postRequest(t, WithKey(context.Background(), "from-ctx"), "x")
		r.Header.Set("Idempotency-Key", `"from-header"`)
		resp, err := tr.RoundTrip(r)
		require.NoError(t, err)
		key, ok := KeyFrom(resp.Request.Context())
		require.True(t, ok)
		require.Equal(t, "from-header", key)
	})
}

func TestNewTransportValidates(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
		want string
	}{
		{"empty header", []Option{WithKeyHeader("")}, `WithKeyHeader: invalid header name ""`},
		{"space in header", []Option{WithKeyHeader("Idempotency Key")}, `WithKeyHeader: invalid header name "Idempotency Key"`},
		{"colon in header", []Option{WithKeyHeader("Key:")}, `WithKeyHeader: invalid header name "Key:"`},
		{"non-ASCII header", []Option{WithKeyHeader("Clé")}, `WithKeyHeader: invalid header name "Clé"`},
		{"no method", []Option{WithRetryMethods()}, "WithRetryMethods with no method"},
		{"empty method", []Option{WithRetryMethods("POST", "")}, `WithRetryMethods: invalid method ""`},
		{"method with a space", []Option{WithRetryMethods("PO ST")}, `WithRetryMethods: invalid method "PO ST"`},
		{"method with a newline", []Option{WithRetryMethods("POST\n")}, `WithRetryMethods: invalid method "POST\n"`},
		{"all errors at once", []Option{WithKeyHeader(""), WithRetryMethods("")}, `WithKeyHeader: invalid header name ""; WithRetryMethods: invalid method ""`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.PanicsWithValue(t, "idem: NewTransport: "+tc.want, func() { NewTransport(nil, tc.opts...) })
		})
	}
}

func TestNewTransportNormalises(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  Option
		want func(*transport) any
		is   any
	}{
		{"defaults", nil, func(t *transport) any {
			return []any{t.header, t.methods, t.attempts, t.backoff, t.backoffCap, t.maxRetryAfter, t.bare}
		}, []any{"Idempotency-Key", []string{"POST", "PATCH"}, 5, 200 * time.Millisecond, 10 * time.Second, 30 * time.Second, false}},
		{"methods in upper case", WithRetryMethods("post", "Put", "POST"), func(t *transport) any { return t.methods }, []string{"POST", "PUT"}},
		{"canonical header", WithKeyHeader("x-request-key"), func(t *transport) any { return t.header }, "X-Request-Key"},
		{"attempts at least 1", WithMaxAttempts(-3), func(t *transport) any { return t.attempts }, 1},
		{"backoff base zero keeps the default", WithBackoff(0, time.Minute), func(t *transport) any { return []time.Duration{t.backoff, t.backoffCap} }, []time.Duration{defaultBackoff, time.Minute}},
		{"backoff limit raised to the base", WithBackoff(time.Second, time.Millisecond), func(t *transport) any { return []time.Duration{t.backoff, t.backoffCap} }, []time.Duration{time.Second, time.Second}},
		{"negative max Retry-After means 0", WithMaxRetryAfter(-time.Second), func(t *transport) any { return t.maxRetryAfter }, time.Duration(0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTransport(nil, tc.opt).(*transport)
			require.Equal(t, http.DefaultTransport, tr.base)
			require.Equal(t, tc.is, tc.want(tr))
		})
	}
}

func TestTransportBareKey(t *testing.T) {
	ok := []func() (*http.Response, error){status(201)}
	t.Run("from WithKey, as it is", func(t *testing.T) {
		base := &scripted{script: ok}
		tr, _ := testTransport(base, WithBareKey())
		_, err := tr.RoundTrip(postRequest(t, WithKey(context.Background(), `order-42`), "x"))
		require.NoError(t, err)
		require.Equal(t, "order-42", base.keys[0])
	})
	t.Run("made by the transport", func(t *testing.T) {
		base := &scripted{script: ok}
		tr, _ := testTransport(base, WithBareKey())
		resp, err := tr.RoundTrip(postRequest(t, context.Background(), "x"))
		require.NoError(t, err)
		require.Regexp(t, `^[0-9a-f-]{36}$`, base.keys[0])
		require.Equal(t, base.keys[0], resp.Request.Header.Get("Idempotency-Key"))
	})
	t.Run("the request's own header is kept", func(t *testing.T) {
		base := &scripted{script: ok}
		tr, _ := testTransport(base, WithBareKey())
		r := postRequest(t, context.Background(), "x")
		r.Header.Set("Idempotency-Key", `"mine"`)
		_, err := tr.RoundTrip(r)
		require.NoError(t, err)
		require.Equal(t, `"mine"`, base.keys[0])
	})
	for _, key := range []string{`"quoted"`, " lead", "trail ", ""} {
		t.Run("a key that cannot be sent bare: "+key, func(t *testing.T) {
			base := &scripted{script: ok}
			tr, _ := testTransport(base, WithBareKey())
			_, err := tr.RoundTrip(postRequest(t, WithKey(context.Background(), key), "x"))
			require.ErrorIs(t, err, ErrInvalidKey)
			require.Empty(t, base.keys, "nothing is sent")
		})
	}
	t.Run("quoted by default, equal for the middleware", func(t *testing.T) {
		quoted := &scripted{script: ok}
		tr, _ := testTransport(quoted)
		_, err := tr.RoundTrip(postRequest(t, WithKey(context.Background(), `a"b`), "x"))
		require.NoError(t, err)
		bare := &scripted{script: ok}
		tr, _ = testTransport(bare, WithBareKey())
		_, err = tr.RoundTrip(postRequest(t, WithKey(context.Background(), `a"b`), "x"))
		require.NoError(t, err)
		require.Equal(t, []string{`"a\"b"`}, quoted.keys)
		require.Equal(t, []string{`a"b`}, bare.keys)
		q, err := wire.ParseKey(quoted.keys[0])
		require.NoError(t, err)
		b, err := wire.ParseKey(bare.keys[0])
		require.NoError(t, err)
		require.Equal(t, q, b)
	})
}

// TestKeyFrom: the key set by WithKey is read back by KeyFrom; a context
// without one reports false.
func TestKeyFrom(t *testing.T) {
	k, ok := KeyFrom(WithKey(context.Background(), "k-1"))
	require.True(t, ok)
	require.Equal(t, "k-1", k)
	_, ok = KeyFrom(context.Background())
	require.False(t, ok)
}
