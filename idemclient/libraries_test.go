package idemclient_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/go-resty/resty/v2"
	"github.com/hashicorp/go-retryablehttp"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemclient"
)

// transportGuard returns a Guard on its own miniredis.
func transportGuard(t *testing.T, opts ...idem.Option) *idem.Guard {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { c.Close() })
	return idem.New(idem.NewRedisStore(c), append([]idem.Option{idem.WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
}

// chargeAPI is POST /payments behind the real middleware: it counts charges,
// and the first answer is lost after the handler ran, either by a gateway
// that answers 502 or by the connection closing.
type chargeAPI struct {
	url      string
	charges  atomic.Int64
	requests atomic.Int64
}

func newChargeAPI(t *testing.T, gateway bool) *chargeAPI {
	t.Helper()
	a := &chargeAPI{}
	api := transportGuard(t).Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.charges.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "paid")
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.requests.Add(1) > 1 {
			api.ServeHTTP(w, r)
			return
		}
		api.ServeHTTP(httptest.NewRecorder(), r) // the work is done, the answer is lost:
		if gateway {
			http.Error(w, "upstream connection lost", http.StatusBadGateway)
			return
		}
		panic(http.ErrAbortHandler) // the connection drops
	}))
	t.Cleanup(srv.Close)
	a.url = srv.URL + "/payments"
	return a
}

// outerRetries sends one POST through a retrying library on top of
// NewTransport; key is sent with WithKey, or as the header when header is
// set, or not at all when empty. It returns the final status and the key the
// final response's request carried.
type outerRetries func(t *testing.T, tr http.RoundTripper, url, key string, header bool) (int, string)

func viaRetryablehttp(t *testing.T, tr http.RoundTripper, url, key string, header bool) (int, string) {
	c := retryablehttp.NewClient()
	c.Logger = nil
	c.RetryMax, c.RetryWaitMin, c.RetryWaitMax = 3, time.Millisecond, 5*time.Millisecond
	c.HTTPClient.Transport = tr
	ctx := context.Background()
	if key != "" && !header {
		ctx = idemclient.WithKey(ctx, key)
	}
	req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, url, []byte(`{"amount":1000}`))
	require.NoError(t, err)
	if header {
		req.Header.Set(idem.DefaultKeyHeader, key)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Request.Header.Get(idem.DefaultKeyHeader)
}

func viaResty(t *testing.T, tr http.RoundTripper, url, key string, header bool) (int, string) {
	c := resty.New().SetTransport(tr).SetLogger(discardLogger{}).
		SetRetryCount(3).SetRetryWaitTime(time.Millisecond).SetRetryMaxWaitTime(5 * time.Millisecond).
		AddRetryCondition(func(r *resty.Response, err error) bool {
			return err != nil || r != nil && r.StatusCode() >= 500
		})
	ctx := context.Background()
	if key != "" && !header {
		ctx = idemclient.WithKey(ctx, key)
	}
	r := c.R().SetContext(ctx).SetBody(`{"amount":1000}`)
	if header {
		r.SetHeader(idem.DefaultKeyHeader, key)
	}
	resp, err := r.Post(url)
	require.NoError(t, err)
	return resp.StatusCode(), resp.RawResponse.Request.Header.Get(idem.DefaultKeyHeader)
}

type discardLogger struct{}

func (discardLogger) Errorf(string, ...any) {}
func (discardLogger) Warnf(string, ...any)  {}
func (discardLogger) Debugf(string, ...any) {}

// TestTransportUnderOuterRetries: go-retryablehttp and resty re-enter
// RoundTrip for each of their retries. The key the caller makes with NewKey
// and passes with WithKey (or the header) is kept across them: one charge.
// Without one, each RoundTrip is a new intent with a new key: the transport
// cannot tell an outer retry from a new request, so the answer lost before
// the outer retry costs a second charge (hence the rule in NewTransport's doc).
func TestTransportUnderOuterRetries(t *testing.T) {
	libraries := map[string]outerRetries{"go-retryablehttp": viaRetryablehttp, "resty": viaResty}
	losses := map[string]struct {
		gateway bool
		opts    []idemclient.Option
	}{
		// NewTransport returns a 502 as it is; the outer library retries it.
		"a gateway answers 502": {gateway: true},
		// NewTransport is told not to retry, so the outer library does.
		"the connection drops": {opts: []idemclient.Option{idemclient.WithMaxAttempts(1)}},
	}
	for lib, send := range libraries {
		for loss, l := range losses {
			for _, tc := range []struct {
				name    string
				key     string
				header  bool
				charges int64
			}{
				{name: "WithKey", key: idemclient.NewKey(), charges: 1},
				{name: "header", key: idemclient.NewKey(), header: true, charges: 1},
				{name: "no key: a new one per RoundTrip", charges: 2},
			} {
				t.Run(lib+"/"+loss+"/"+tc.name, func(t *testing.T) {
					api := newChargeAPI(t, l.gateway)
					tr := idemclient.NewTransport(&http.Transport{DisableKeepAlives: true}, l.opts...)
					code, sent := send(t, tr, api.url, tc.key, tc.header)
					require.Equal(t, http.StatusCreated, code)
					require.Equal(t, int64(2), api.requests.Load(), "one lost answer, one outer retry")
					require.Equal(t, tc.charges, api.charges.Load())
					require.NotEmpty(t, sent, "the response shows the key that was sent")
					switch {
					case tc.header:
						require.Equal(t, tc.key, sent)
					case tc.key != "":
						require.Equal(t, `"`+tc.key+`"`, sent)
					}
				})
			}
		}
	}
}

// TestTransportAgainstTheMiddleware: the transport retries the middleware's
// in-progress 409 and returns a handler's own 409 at once, body intact.
func TestTransportAgainstTheMiddleware(t *testing.T) {
	t.Run("the handler's own 409", func(t *testing.T) {
		var runs atomic.Int64
		g := transportGuard(t)
		srv := httptest.NewServer(g.Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			http.Error(w, "account frozen", http.StatusConflict)
		})))
		t.Cleanup(srv.Close)
		client := &http.Client{Transport: idemclient.NewTransport(nil)}
		resp, err := client.Post(srv.URL, "application/json", strings.NewReader(`{"amount":1000}`))
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusConflict, resp.StatusCode)
		require.Equal(t, "account frozen\n", string(b))
		require.Equal(t, int64(1), runs.Load(), "not retried")
	})
	t.Run("the in-progress 409", func(t *testing.T) {
		var runs atomic.Int64
		started, release := make(chan struct{}), make(chan struct{})
		g := transportGuard(t, idem.WithLease(time.Second)) // Retry-After: 1
		srv := httptest.NewServer(g.Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if runs.Add(1) == 1 {
				close(started)
				<-release
			}
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "paid")
		})))
		t.Cleanup(srv.Close)
		key := idemclient.NewKey()
		first := make(chan int, 1)
		go func() {
			req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":1000}`))
			req.Header.Set(idem.DefaultKeyHeader, key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				first <- 0
				return
			}
			resp.Body.Close()
			first <- resp.StatusCode
		}()
		<-started

		var (
			mu       sync.Mutex
			codes    []int
			released sync.Once
		)
		base := roundTripper(func(r *http.Request) (*http.Response, error) {
			resp, err := http.DefaultTransport.RoundTrip(r)
			if err == nil {
				mu.Lock()
				if codes = append(codes, resp.StatusCode); resp.StatusCode == http.StatusConflict {
					released.Do(func() { close(release) }) // the first request finishes while the duplicate waits
				}
				mu.Unlock()
			}
			return resp, err
		})
		client := &http.Client{Transport: idemclient.NewTransport(base)}
		req, err := http.NewRequestWithContext(idemclient.WithKey(context.Background(), key), http.MethodPost, srv.URL, strings.NewReader(`{"amount":1000}`))
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		require.Equal(t, "paid", string(b))
		require.Equal(t, "true", resp.Header.Get(idem.ReplayedHeader))
		require.Equal(t, http.StatusCreated, <-first)
		require.Equal(t, []int{http.StatusConflict, http.StatusCreated}, codes)
		require.Equal(t, int64(1), runs.Load())
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
