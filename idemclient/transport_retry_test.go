package idemclient

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/wire"
)

// inProgressBody is the body of the middleware's answer to a duplicate of a
// request that is still running.
var inProgressBody = `{"type":"` + wire.InProgressProblem + `","title":"Request in progress","status":409,"detail":"A request with this key is still being processed."}`

// respond answers with code, a Content-Type and a body.
func respond(code int, contentType, body string, header ...string) func() (*http.Response, error) {
	return func() (*http.Response, error) {
		resp, err := status(code, append([]string{"Content-Type", contentType}, header...)...)()
		resp.Body = io.NopCloser(strings.NewReader(body))
		return resp, err
	}
}

// inProgress answers as the middleware does while the first request runs.
func inProgress(header ...string) func() (*http.Response, error) {
	return respond(http.StatusConflict, "application/problem+json", inProgressBody, header...)
}

// nilBody answers with code and a nil Body, as some RoundTrippers in tests do.
func nilBody(code int) func() (*http.Response, error) {
	return func() (*http.Response, error) { return &http.Response{StatusCode: code, Header: http.Header{}}, nil }
}

// failingBody yields its text, then err.
type failingBody struct {
	r   io.Reader
	err error
}

func (b *failingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		err = b.err
	}
	return n, err
}

func (b *failingBody) Close() error { return nil }

func TestTransportRetriesWithTheSameKey(t *testing.T) {
	base := &scripted{script: []func() (*http.Response, error){
		inProgress("Retry-After", "2"),
		netErr,
		status(429, "Retry-After", clock.Add(3*time.Second).Format(http.TimeFormat)),
		status(503),
		status(201),
	}}
	tr, slept := testTransport(base, WithBackoff(100*time.Millisecond, time.Second))
	req := postRequest(t, context.Background(), `{"amount":1}`)
	resp, err := ended(t, func() (*http.Response, error) { return tr.RoundTrip(req) })
	require.NoError(t, err)
	require.Equal(t, 201, resp.StatusCode)

	require.Len(t, base.keys, 5)
	for i, k := range base.keys {
		require.Equal(t, base.keys[0], k, "never a new key")
		require.Equal(t, `{"amount":1}`, base.bodies[i], "the body is sent again")
	}
	key, err := wire.ParseKey(base.keys[0])
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

func TestTransportRetries409OnlyWhenInProgress(t *testing.T) {
	big := strings.TrimSuffix(inProgressBody, "}") + strings.Repeat(" ", 8<<10) + "}"
	peek := strings.TrimSuffix(inProgressBody, "}") + strings.Repeat(" ", maxProblemPeek-len(inProgressBody)) + "}"
	for _, tc := range []struct {
		name    string
		answer  func() (*http.Response, error)
		retried bool
		body    string // what the caller reads when it is not retried
		readErr string // the error the caller gets after body
	}{
		{name: "idem's in-progress problem", answer: inProgress(), retried: true},
		{name: "media type with parameters, any case", answer: respond(409, "Application/Problem+JSON; charset=utf-8", inProgressBody), retried: true},
		{name: "the handler's own 409", answer: respond(409, "text/plain", "account frozen"), body: "account frozen"},
		{name: "another problem type", answer: respond(409, "application/problem+json", `{"type":"https://api.test/frozen","title":"Account frozen"}`), body: `{"type":"https://api.test/frozen","title":"Account frozen"}`},
		{name: "problem without a type", answer: respond(409, "application/problem+json", `{"title":"Conflict"}`), body: `{"title":"Conflict"}`},
		{name: "in-progress type as plain JSON", answer: respond(409, "application/json", inProgressBody), body: inProgressBody},
		{name: "no Content-Type", answer: respond(409, "", inProgressBody), body: inProgressBody},
		{name: "not JSON", answer: respond(409, "application/problem+json", "<html>frozen</html>"), body: "<html>frozen</html>"},
		{name: "larger than the prefix read: intact", answer: respond(409, "application/problem+json", big), body: big},
		{name: "as large as the prefix read", answer: respond(409, "application/problem+json", peek), retried: true},
		{name: "a byte larger than the prefix read", answer: respond(409, "application/problem+json", peek+" "), body: peek + " "},
		{name: "no body", answer: nilBody(409), body: ""},
		{name: "unreadable body", answer: func() (*http.Response, error) {
			resp, _ := respond(409, "application/problem+json", "")()
			resp.Body = &failingBody{strings.NewReader(`{"type":`), errors.New("connection reset")}
			return resp, nil
		}, body: `{"type":`, readErr: "connection reset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := &scripted{script: []func() (*http.Response, error){tc.answer, status(201)}}
			tr, _ := testTransport(base)
			resp, err := ended(t, func() (*http.Response, error) {
				return tr.RoundTrip(postRequest(t, context.Background(), "x"))
			})
			require.NoError(t, err)
			if tc.retried {
				require.Equal(t, 201, resp.StatusCode)
				require.Len(t, base.keys, 2)
				return
			}
			require.Equal(t, 409, resp.StatusCode)
			require.Len(t, base.keys, 1, "someone else's 409 is not retried")
			var b []byte
			_, err = ended(t, func() (*http.Response, error) {
				var err error
				b, err = io.ReadAll(resp.Body)
				return nil, err
			})
			require.Equal(t, tc.body, string(b), "the caller gets the whole body")
			if tc.readErr != "" {
				require.ErrorContains(t, err, tc.readErr)
			} else {
				require.NoError(t, err)
			}
			require.NoError(t, resp.Body.Close())
		})
	}
}

// ended runs f, which reads a few KiB from memory, and fails the test if it
// has not returned after 10s, far beyond what it takes: a body without end
// must fail the test, not hang it.
func ended(t *testing.T, f func() (*http.Response, error)) (*http.Response, error) {
	t.Helper()
	type result struct {
		resp *http.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := f()
		done <- result{resp, err}
	}()
	select {
	case r := <-done:
		return r.resp, r.err
	case <-time.After(10 * time.Second):
		t.Fatal("never ended: a body without end")
		return nil, nil
	}
}

func TestTransportNilBody(t *testing.T) {
	for _, code := range []int{409, 429, 503} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			base := &scripted{script: []func() (*http.Response, error){nilBody(code), status(201)}}
			tr, _ := testTransport(base)
			resp, err := tr.RoundTrip(postRequest(t, context.Background(), "x"))
			require.NoError(t, err)
			require.NotNil(t, resp.Body)
			if code == 409 { // no body: not the in-progress problem
				require.Equal(t, 409, resp.StatusCode)
				return
			}
			require.Equal(t, 201, resp.StatusCode)
			require.Len(t, base.keys, 2)
		})
	}
	t.Run("returned as is, with an empty body", func(t *testing.T) {
		base := &scripted{script: []func() (*http.Response, error){nilBody(503)}}
		tr, _ := testTransport(base, WithMaxAttempts(1))
		resp, err := tr.RoundTrip(postRequest(t, context.Background(), "x"))
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Empty(t, b)
	})
}

func TestTransportRetryAfterBeyondTheMaximum(t *testing.T) {
	for _, tc := range []struct {
		retryAfter string
		max        time.Duration // 0: the default
		retried    bool
	}{
		{retryAfter: "30", retried: true},
		{retryAfter: "31"},
		{retryAfter: "4294967295"},             // 2³²−1
		{retryAfter: "4294967296"},             // 2³²
		{retryAfter: "99999999999"},            // beyond a 32-bit number
		{retryAfter: "18446744073709551616"},   // 2⁶⁴
		{retryAfter: "9999999999999999999999"}, // beyond any integer type
		{retryAfter: "Fri, 31 Dec 9999 23:59:59 GMT"},
		{retryAfter: "5", max: 5 * time.Second, retried: true},
		{retryAfter: "6", max: 5 * time.Second},
	} {
		t.Run(tc.retryAfter, func(t *testing.T) {
			base := &scripted{script: []func() (*http.Response, error){status(503, "Retry-After", tc.retryAfter), status(201)}}
			var opts []Option
			if tc.max > 0 {
				opts = append(opts, WithMaxRetryAfter(tc.max))
			}
			tr, slept := testTransport(base, opts...)
			resp, err := tr.RoundTrip(postRequest(t, context.Background(), "x"))
			require.NoError(t, err)
			if tc.retried {
				require.Equal(t, 201, resp.StatusCode)
				require.Len(t, *slept, 1)
				return
			}
			require.Equal(t, 503, resp.StatusCode, "returned at once")
			require.Len(t, base.keys, 1)
			require.Empty(t, *slept, "no backoff either")
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, "Service Unavailable", string(b))
		})
	}
}

func TestTransportBackoffIsCapped(t *testing.T) {
	base := &scripted{script: []func() (*http.Response, error){netErr}}
	tr, slept := testTransport(base, WithBackoff(100*time.Millisecond, 300*time.Millisecond), WithMaxAttempts(6))
	_, err := tr.RoundTrip(postRequest(t, context.Background(), ""))
	require.ErrorContains(t, err, "connection reset")
	require.Len(t, base.keys, 6)
	require.Equal(t, []time.Duration{100*time.Millisecond - 1, 200*time.Millisecond - 1, 300*time.Millisecond - 1, 300*time.Millisecond - 1, 300*time.Millisecond - 1}, *slept)
}

// TestTransportBackoffNeverOverflows: the limit of a backoff is base·2ⁿ⁻¹
// while that is below the cap, and the cap from there on, however many the
// retries: a shift that overflows (to zero or below) never shortens it.
func TestTransportBackoffNeverOverflows(t *testing.T) {
	const base = 1 << 33 // ns: base·2³¹ overflows to exactly 0
	tr, _ := testTransport(nil, WithBackoff(base, time.Hour))
	for attempt := 1; attempt <= 70; attempt++ {
		want := time.Hour
		if attempt <= 9 { // 2⁴¹ns, about 37 minutes
			want = time.Duration(base) << (attempt - 1)
		}
		require.Equal(t, want-1, tr.backoffFor(attempt), "attempt %d", attempt)
	}
}

// TestSleepCtxEndedContext: a context that has ended ends every sleep at
// once with its error, a zero one included.
func TestSleepCtxEndedContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 100 { // a select between two ready cases chooses at random
		for _, d := range []time.Duration{-1, 0, time.Hour} {
			require.ErrorIs(t, sleepCtx(ctx, d), context.Canceled, "%v", d)
		}
	}
	require.NoError(t, sleepCtx(context.Background(), 0))
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
		base := &scripted{script: []func() (*http.Response, error){inProgress("Retry-After", "31"), status(201)}}
		tr, slept := testTransport(base)
		resp, err := tr.RoundTrip(postRequest(t, context.Background(), "x"))
		require.NoError(t, err)
		require.Equal(t, 409, resp.StatusCode)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, inProgressBody, string(b))
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
		select {
		case <-sleeping:
		case err := <-done:
			t.Fatalf("RoundTrip returned without waiting for the Retry-After: %v", err)
		}
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

func TestRetryAfter(t *testing.T) {
	const forever = time.Duration(1<<63 - 1)
	for v, want := range map[string]time.Duration{
		"0": 0, "7": 7 * time.Second, "007": 7 * time.Second,
		"4294967296":              4294967296 * time.Second,
		"9223372036":              9223372036 * time.Second, // the largest that fits
		"9223372037":              forever,
		"99999999999999999999999": forever,
		clock.Add(90 * time.Second).Format(http.TimeFormat): 90 * time.Second,
		clock.Add(-time.Hour).Format(http.TimeFormat):       0,
		"Fri, 31 Dec 9999 23:59:59 GMT":                     forever,
	} {
		d, ok := retryAfter(v, clock)
		require.True(t, ok, v)
		require.Equal(t, want, d, v)
	}
	for _, v := range []string{"", "-1", "+1", "1.5", "1e3", "soon", " 5"} {
		_, ok := retryAfter(v, clock)
		require.False(t, ok, v)
	}
}
