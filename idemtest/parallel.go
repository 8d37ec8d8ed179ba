package idemtest

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"

	"github.com/idemkit/idem"
)

// ParallelResult is what Parallel observed.
type ParallelResult struct {
	// Ran is how many times the handler ran: 1 when the middleware did its
	// job (0 when every copy was refused, e.g. for a missing key).
	Ran int
	// Statuses counts the responses by status code.
	Statuses map[int]int
	// Replayed counts the responses marked Idempotent-Replayed: true.
	Replayed int
	// Responses holds every response, in no particular order.
	Responses []*httptest.ResponseRecorder
	// Panics holds what the copies that panicked (in h or mw) panicked
	// with; their responses are 500 unless something was written before.
	Panics []any
}

// Parallel sends n copies of r at once through mw to h, each from a
// goroutine of its own, and reports how many times h ran and what the copies
// got. It is the design's test, made reusable: send the same request with
// the same key in parallel, and assert that the side effect happened once.
//
//	res := idemtest.Parallel(16, req, g.Middleware(), payments)
//	if res.Ran != 1 { t.Fatalf("handler ran %d times", res.Ran) }
//
// mw is the middleware under test, typically g.Middleware(opts...); h the
// handler it protects. r's body is read once and each copy gets its own
// reader over it (r's Body is replaced by an equal one). Without WithWait,
// copies arriving while the first runs get 409; with it, they wait and get
// the first response, replayed. n below 1 sends nothing.
func Parallel(n int, r *http.Request, mw func(http.Handler) http.Handler, h http.Handler) ParallelResult {
	res := ParallelResult{Statuses: map[int]int{}}
	if n < 1 {
		return res
	}
	var body []byte
	if r.Body != nil && r.Body != http.NoBody {
		body, _ = io.ReadAll(r.Body)
		_ = r.Body.Close()
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	var ran atomic.Int64
	counted := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		h.ServeHTTP(w, r)
	}))
	res.Responses = make([]*httptest.ResponseRecorder, n)
	start := make(chan struct{})
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	for i := range res.Responses {
		c := r.Clone(r.Context())
		c.Body, c.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		rec := httptest.NewRecorder()
		res.Responses[i] = rec
		wg.Go(func() {
			defer func() {
				if p := recover(); p != nil {
					mu.Lock()
					res.Panics = append(res.Panics, p)
					mu.Unlock()
					if !rec.Flushed && rec.Body.Len() == 0 {
						rec.Code = http.StatusInternalServerError
					}
				}
			}()
			<-start
			counted.ServeHTTP(rec, c)
		})
	}
	close(start)
	wg.Wait()
	res.Ran = int(ran.Load())
	for _, rec := range res.Responses {
		res.Statuses[rec.Code]++
		if rec.Header().Get(idem.ReplayedHeader) == "true" {
			res.Replayed++
		}
	}
	return res
}
