package idemlambda_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// runtimeAPI emulates the Lambda Runtime API (version 2018-06-01) of one
// instance, as the runtime in aws-lambda-go uses it: GET
// /2018-06-01/runtime/invocation/next hands the next invocation to the
// function, with its request id and deadline in the headers
// Lambda-Runtime-Aws-Request-Id and Lambda-Runtime-Deadline-Ms; POST
// .../invocation/{id}/response and .../invocation/{id}/error answer it.
// AWS_LAMBDA_RUNTIME_API=Addr() points lambda.Start at it.
type runtimeAPI struct {
	srv     *httptest.Server
	queue   chan *invocation
	stop    chan struct{}
	seq     atomic.Int64
	mu      sync.Mutex
	pending map[string]*invocation
	polls   chan time.Time // when the function asked for its next invocation
}

// invocation is one invocation sent to an instance.
type invocation struct {
	id       string
	payload  []byte
	deadline time.Time
	handed   time.Time // when the function received it
	answer   chan answer
}

// answer is what the function posted for an invocation.
type answer struct {
	body   []byte
	failed bool // posted to .../error: the body is the error's JSON
	at     time.Time
}

func newRuntimeAPI(t *testing.T) *runtimeAPI {
	t.Helper()
	api := &runtimeAPI{
		queue:   make(chan *invocation, 16),
		stop:    make(chan struct{}),
		pending: map[string]*invocation{},
		polls:   make(chan time.Time, 64),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /2018-06-01/runtime/invocation/next", api.next)
	mux.HandleFunc("POST /2018-06-01/runtime/invocation/{id}/response", func(w http.ResponseWriter, r *http.Request) {
		api.post(w, r, false)
	})
	mux.HandleFunc("POST /2018-06-01/runtime/invocation/{id}/error", func(w http.ResponseWriter, r *http.Request) {
		api.post(w, r, true)
	})
	api.srv = httptest.NewServer(mux)
	t.Cleanup(func() {
		close(api.stop)
		api.srv.Close()
	})
	return api
}

// Addr is the value of AWS_LAMBDA_RUNTIME_API for the instance.
func (api *runtimeAPI) Addr() string { return strings.TrimPrefix(api.srv.URL, "http://") }

// Invoke queues an invocation of payload whose deadline is timeout from
// now, as Lambda sets it from the function's timeout.
func (api *runtimeAPI) Invoke(payload []byte, timeout time.Duration) *invocation {
	inv := &invocation{
		id:       "req-" + strconv.FormatInt(api.seq.Add(1), 10),
		payload:  payload,
		deadline: time.Now().Add(timeout),
		answer:   make(chan answer, 1),
	}
	api.queue <- inv
	return inv
}

// Wait returns the answer to inv.
func (inv *invocation) Wait(t testing.TB) answer {
	t.Helper()
	select {
	case a := <-inv.answer:
		return a
	case <-time.After(30 * time.Second):
		t.Fatalf("invocation %s not answered", inv.id)
	}
	return answer{}
}

func (api *runtimeAPI) next(w http.ResponseWriter, r *http.Request) {
	select {
	case api.polls <- time.Now():
	default:
	}
	var inv *invocation
	select {
	case inv = <-api.queue:
	case <-r.Context().Done(): // the instance is gone
		return
	case <-api.stop:
		return
	}
	api.mu.Lock()
	api.pending[inv.id] = inv
	api.mu.Unlock()
	inv.handed = time.Now()
	h := w.Header()
	h.Set("Lambda-Runtime-Aws-Request-Id", inv.id)
	h.Set("Lambda-Runtime-Deadline-Ms", strconv.FormatInt(inv.deadline.UnixMilli(), 10))
	h.Set("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:eu-west-1:123456789012:function:payments")
	h.Set("Lambda-Runtime-Trace-Id", "Root=1-00000000-000000000000000000000000;Sampled=0")
	h.Set("Content-Type", "application/json")
	_, _ = w.Write(inv.payload)
}

func (api *runtimeAPI) post(w http.ResponseWriter, r *http.Request, failed bool) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	api.mu.Lock()
	inv := api.pending[r.PathValue("id")]
	delete(api.pending, r.PathValue("id"))
	api.mu.Unlock()
	if inv == nil {
		http.Error(w, `{"errorType":"InvalidRequestID"}`, http.StatusBadRequest)
		return
	}
	inv.answer <- answer{body: body, failed: failed, at: time.Now()}
	w.WriteHeader(http.StatusAccepted)
	_, _ = io.WriteString(w, `{"status":"OK"}`)
}

// firstPoll returns when the function first asked for an invocation: the
// end of its initialisation.
func (api *runtimeAPI) firstPoll(t testing.TB) time.Time {
	t.Helper()
	select {
	case at := <-api.polls:
		return at
	case <-time.After(30 * time.Second):
		t.Fatal("the function never asked for an invocation")
	}
	return time.Time{}
}
