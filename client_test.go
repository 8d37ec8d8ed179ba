package idem

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
)

func TestNewKey(t *testing.T) {
	uuid4 := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := make(map[string]bool)
	for range 1000 {
		k := NewKey()
		require.Regexp(t, uuid4, k)
		require.NoError(t, validKey(k))
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
func testTransport(base http.RoundTripper, opts ...TransportOption) (*transport, *[]time.Duration) {
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

func TestTransportRetriesWithTheSameKey(t *testing.T) {
	base := &scripted{script: []func() (*http.Response, error){
		status(409, "Retry-After", "2"),
		netErr,
		status(429, "Retry-After", clock.Add(3*time.Second).Format(http.TimeFormat)),
		status(503),
		status(201),
	}}
	tr, slept := testTransport(base, WithBackoff(100*time.Millisecond, time.Second))
	req := postRequest(t, context.Background(), `{"amount":1}`)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	require.Equal(t, 201, resp.StatusCode)

	require.Len(t, base.keys, 5)
	for _, k := range base.keys {
		require.Equal(t, base.keys[0], k, "never a new key")
		require.Equal(t, `{"amount":1}`, base.bodies[0], "the body is sent again")
	}
	key, err := parseKey(base.keys[0])
	require.NoError(t, err)
	require.Regexp(t, `^[0-9a-f-]{36}$`, key)
	require.Equal(t, []time.Duration{
		2 * time.Second,          // Retry-After seconds
		200*time.Millisecond - 1, // backoff after attempt 2: up to base·2
		3 * time.Second,          // Retry-After date
		800*time.Millisecond - 1, // backoff after attempt 4: up to base·8
	}, *slept)
	require.Empty(t, req.Header.Get("Idempotency-Key"), "the caller's request is not changed")
}

func TestTransportBackoffIsCapped(t *testing.T) {
	base := &scripted{script: []func() (*http.Response, error){netErr}}
	tr, slept := testTransport(base, WithBackoff(100*time.Millisecond, 300*time.Millisecond), WithMaxAttempts(6))
	_, err := tr.RoundTrip(postRequest(t, context.Background(), ""))
	require.ErrorContains(t, err, "connection reset")
	require.Len(t, base.keys, 6)
	require.Equal(t, []time.Duration{100*time.Millisecond - 1, 200*time.Millisecond - 1, 300*time.Millisecond - 1, 300*time.Millisecond - 1, 300*time.Millisecond - 1}, *slept)
}

func TestTransportGivesUp(t *testing.T) {
	t.Run("after max attempts, with the last response", func(t *testing.T) {
		base := &scripted{script: []func() (*http.Response, error){status(503)}}
		tr, _ := testTransport(base)
		resp, err := tr.RoundTrip(postRequest(t, context.Background(), "x"))
		require.NoError(t, err)
		require.Equal(t, 503, resp.StatusCode)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, "Service Unavailable", string(b), "the last body is left to the caller")
		require.Len(t, base.keys, 5)
	})
	t.Run("when Retry-After is above the cap", func(t *testing.T) {
		base := &scripted{script: []func() (*http.Response, error){status(409, "Retry-After", "31"), status(201)}}
		tr, slept := testTransport(base)
		resp, err := tr.RoundTrip(postRequest(t, context.Background(), "x"))
		require.NoError(t, err)
		require.Equal(t, 409, resp.StatusCode)
		require.Len(t, base.keys, 1)
		require.Empty(t, *slept)
	})
	t.Run("when the context ends during an attempt, with its outcome", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		base := &scripted{script: []func() (*http.Response, error){func() (*http.Response, error) {
			cancel()
			return status(503)()
		}}}
		tr, _ := testTransport(base)
		resp, err := tr.RoundTrip(postRequest(t, ctx, "x"))
		require.NoError(t, err)
		require.Equal(t, 503, resp.StatusCode)
		require.Len(t, base.keys, 1)
	})
	t.Run("when the context ends during a wait, with its error", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		base := &scripted{script: []func() (*http.Response, error){status(503, "Retry-After", "10")}}
		tr := NewTransport(base).(*transport)
		sleeping := make(chan struct{})
		tr.sleep = func(ctx context.Context, d time.Duration) error {
			close(sleeping)
			return sleepCtx(ctx, d) // really waits
		}
		done := make(chan error)
		go func() {
			_, err := tr.RoundTrip(postRequest(t, ctx, "x"))
			done <- err
		}()
		<-sleeping
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		require.Len(t, base.keys, 1)
	})
	for _, code := range []int{200, 201, 400, 404, 422, 500, 502} {
		base := &scripted{script: []func() (*http.Response, error){status(code)}}
		tr, _ := testTransport(base)
		resp, err := tr.RoundTrip(postRequest(t, context.Background(), "x"))
		require.NoError(t, err)
		require.Equal(t, code, resp.StatusCode)
		require.Len(t, base.keys, 1, "%d is not retried", code)
	}
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
	t.Run("header name", func(t *testing.T) {
		var got http.Header
		tr := NewTransport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
			got = r.Header
			return status(201)()
		}), WithTransportKeyHeader("x-request-key"))
		_, err := tr.RoundTrip(postRequest(t, context.Background(), "x"))
		require.NoError(t, err)
		require.NotEmpty(t, got.Get("X-Request-Key"))
		require.Empty(t, got.Get("Idempotency-Key"))
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestTransportMethods(t *testing.T) {
	for _, tc := range []struct {
		method string
		opts   []TransportOption
		keyed  bool
	}{
		{"POST", nil, true},
		{"PATCH", nil, true},
		{"PUT", nil, false},
		{"GET", nil, false},
		{"PUT", []TransportOption{WithRetryMethods("PUT")}, true},
		{"POST", []TransportOption{WithRetryMethods("PUT")}, false},
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

func TestRetryAfter(t *testing.T) {
	for v, want := range map[string]time.Duration{
		"0": 0, "7": 7 * time.Second,
		clock.Add(90 * time.Second).Format(http.TimeFormat): 90 * time.Second,
		clock.Add(-time.Hour).Format(http.TimeFormat):       0,
	} {
		d, ok := retryAfter(v, clock)
		require.True(t, ok, v)
		require.Equal(t, want, d, v)
	}
	for _, v := range []string{"", "-1", "1.5", "soon", "99999999999"} {
		_, ok := retryAfter(v, clock)
		require.False(t, ok, v)
	}
}

func TestRetrySeconds(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "1", time.Millisecond: "1", time.Second: "1", 1001 * time.Millisecond: "2", 29*time.Second + 1: "30",
	} {
		require.Equal(t, want, retrySeconds(d), d.String())
	}
}
