package idem_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/redistest"
)

// cannedStore answers without I/O, to measure the middleware's own cost:
// every Claim is ClaimOK, or ClaimCompleted with the payload last completed when
// replay is set.
type cannedStore struct {
	replay  bool
	payload atomic.Pointer[[]byte]
}

// ReturnsByDeadline implements idemstore.DeadlineAware: the store answers at
// once, as a Redis client with ContextTimeoutEnabled returns by the
// deadline, so the Guard calls it on the caller's goroutine.
func (s *cannedStore) ReturnsByDeadline() bool { return true }

func (s *cannedStore) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	if p := s.payload.Load(); s.replay && p != nil {
		return idemstore.ClaimResult{Status: idemstore.ClaimCompleted, Payload: *p}, nil
	}
	return idemstore.ClaimResult{Status: idemstore.ClaimOK, Fence: 1}, nil
}
func (s *cannedStore) Heartbeat(context.Context, string, string, time.Duration) error { return nil }
func (s *cannedStore) Checkpoint(context.Context, string, string, string, []byte) error {
	return nil
}
func (s *cannedStore) Complete(ctx context.Context, id, owner string, p []byte, r time.Duration) error {
	s.payload.Store(&p)
	return nil
}
func (s *cannedStore) Release(context.Context, string, string) error { return nil }
func (s *cannedStore) Read(context.Context, string) (*idemstore.Record, error) {
	return nil, nil
}

// discardWriter is a ResponseWriter that costs nothing.
type discardWriter struct {
	h    http.Header
	code int
	n    int
}

func (w *discardWriter) Header() http.Header  { return w.h }
func (w *discardWriter) WriteHeader(code int) { w.code = code }
func (w *discardWriter) Write(p []byte) (int, error) {
	w.n += len(p)
	return len(p), nil
}

var (
	benchBody = []byte(`{"amount": 1000, "currency": "EUR", "customer": "cus_4QFJ", "description": "order 1042"}`)
	benchResp = []byte(`{"id":"pay_9f8e7d6c","amount":1000,"currency":"EUR","status":"succeeded"}`)
)

// benchRespString is benchResp, for handlers that write strings.
const benchRespString = `{"id":"pay_9f8e7d6c","amount":1000,"currency":"EUR","status":"succeeded"}`

// benchHandler is a typical small JSON endpoint.
var benchHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Location"] = []string{"/payments/pay_9f8e7d6c"}
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(benchResp)
})

// serveLoop sends the same request through h b.N times; key returns the key
// of iteration i ("" for none).
func serveLoop(b *testing.B, h http.Handler, method string, key func(i int) string, want int) {
	b.Helper()
	rd := bytes.NewReader(benchBody)
	r := httptest.NewRequest(method, "/payments?source=app", nil)
	r.Body = io.NopCloser(rd)
	r.ContentLength = int64(len(benchBody))
	r.Header["Content-Type"] = []string{"application/json"}
	w := &discardWriter{h: http.Header{}}
	keys := []string{""}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		rd.Reset(benchBody)
		clear(w.h)
		w.code = 0
		if k := key(i); k != "" {
			keys[0] = k
			r.Header["Idempotency-Key"] = keys
		}
		i++
		h.ServeHTTP(w, r)
		if w.code != want {
			b.Fatalf("status %d, want %d", w.code, want)
		}
	}
}

func constKey(string) func(int) string {
	return func(int) string { return "8e03978e-40d5-43e8-bc93-6894a57f9324" }
}

// BenchmarkMiddleware measures the middleware's own CPU and allocations per
// request, the store excluded (a canned store answers in memory), against
// the bare handler. The redis-server variants include the real round trips.
func BenchmarkMiddleware(b *testing.B) {
	quietGuard := func(s idemstore.Store) *idem.Guard { return idem.New(s, quiet) }
	b.Run("bare-handler", func(b *testing.B) {
		serveLoop(b, benchHandler, http.MethodPost, func(int) string { return "" }, 201)
	})
	b.Run("passthrough-GET", func(b *testing.B) {
		h := quietGuard(&cannedStore{}).Middleware()(benchHandler)
		serveLoop(b, h, http.MethodGet, func(int) string { return "" }, 201)
	})
	b.Run("first-request", func(b *testing.B) {
		h := quietGuard(&cannedStore{}).Middleware()(benchHandler)
		serveLoop(b, h, http.MethodPost, constKey(""), 201)
	})
	b.Run("replay", func(b *testing.B) {
		s := &cannedStore{}
		h := quietGuard(s).Middleware()(benchHandler)
		r := httptest.NewRequest(http.MethodPost, "/payments?source=app", bytes.NewReader(benchBody))
		r.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(httptest.NewRecorder(), r) // stores the payload
		s.replay = true
		serveLoop(b, h, http.MethodPost, constKey(""), 201)
	})
	b.Run("key-from-json/first-request", func(b *testing.B) {
		h := quietGuard(&cannedStore{}).Middleware(
			idem.WithKeyFunc(idem.KeyFromJSON("/customer")),
			idem.WithFingerprint(idem.FingerprintJSON("/amount", "/currency")))(benchHandler)
		serveLoop(b, h, http.MethodPost, func(int) string { return "" }, 201)
	})
	b.Run("miniredis/first-request", func(b *testing.B) {
		c := redis.NewClient(&redis.Options{Addr: miniredis.RunT(b).Addr()})
		b.Cleanup(func() { c.Close() })
		h := quietGuard(idem.NewRedisStore(c)).Middleware()(benchHandler)
		serveLoop(b, h, http.MethodPost, func(i int) string { return fmt.Sprint("k", i) }, 201)
	})
	b.Run("redis-server/first-request", func(b *testing.B) {
		srv := redistest.Shared(b)
		h := quietGuard(idem.NewRedisStore(srv.Client(b), idem.WithPrefix(redistest.Prefix(b)))).Middleware()(benchHandler)
		serveLoop(b, h, http.MethodPost, func(i int) string { return fmt.Sprint("k", i) }, 201)
	})
	b.Run("redis-server/replay", func(b *testing.B) {
		srv := redistest.Shared(b)
		h := quietGuard(idem.NewRedisStore(srv.Client(b), idem.WithPrefix(redistest.Prefix(b)))).Middleware()(benchHandler)
		serveLoop(b, h, http.MethodPost, constKey(""), 201)
	})
	b.Run("redis-server/same-key-parallel", func(b *testing.B) {
		// Every goroutine repeats one key: one run, then replays.
		srv := redistest.Shared(b)
		h := quietGuard(idem.NewRedisStore(srv.Client(b), idem.WithPrefix(redistest.Prefix(b)))).Middleware()(benchHandler)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r := httptest.NewRequest(http.MethodPost, "/payments", bytes.NewReader(benchBody))
				r.Header.Set("Idempotency-Key", "same")
				w := &discardWriter{h: http.Header{}}
				h.ServeHTTP(w, r)
				if w.code != 201 && w.code != 409 {
					b.Errorf("status %d", w.code)
					return
				}
			}
		})
	})
}

// BenchmarkRecordMemoryHTTP reports the Redis memory of one completed
// HTTP record (MEMORY USAGE of its key, key name and Redis overhead
// included) against the response body it stores.
func BenchmarkRecordMemoryHTTP(b *testing.B) {
	srv := redistest.Shared(b)
	c := srv.Client(b)
	prefix := redistest.Prefix(b)
	h := idem.New(idem.NewRedisStore(c, idem.WithPrefix(prefix)), quiet).Middleware()(benchHandler)
	ctx := context.Background()
	var usage int64
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, "/payments", bytes.NewReader(benchBody))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", idemclient.NewKey())
		h.ServeHTTP(&discardWriter{h: http.Header{}}, r)
	}
	keys, err := c.Keys(ctx, prefix+":*").Result()
	if err != nil || len(keys) == 0 {
		b.Fatal(keys, err)
	}
	for _, k := range keys {
		n, err := c.MemoryUsage(ctx, k, 0).Result()
		if err != nil {
			b.Fatal(err)
		}
		usage += n
	}
	b.ReportMetric(float64(usage)/float64(len(keys)), "B/record")
	b.ReportMetric(float64(usage)/float64(len(keys))-float64(len(benchResp)), "B/record-over-body")
}
