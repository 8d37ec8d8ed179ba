package rpcidem

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/idemtest"
)

// testProtocol names the protocol of these tests, as a module names its own.
var testProtocol = &Protocol{
	Package:     "rpctest",
	Constructor: "NewInterceptor",
	Method:      "method",
	FullMethod:  "full method",
	KeyName:     "idempotency-key",
	KeyPlace:    "metadata",
}

const (
	methodCharge = "/pay.v1.Payments/Charge"
	methodRefund = "/pay.v1.Payments/Refund"
)

// option is a module's ServerOption.
type option = func(*ServerConfig)

// store is a MemoryStore that counts claims and may answer them itself.
type store struct {
	*idemtest.MemoryStore
	claims atomic.Int32
	claim  func(ctx context.Context) (idemstore.ClaimResult, error) // nil: the MemoryStore's
}

func newStore() *store { return &store{MemoryStore: idemtest.NewMemoryStore()} }

func (s *store) Claim(ctx context.Context, id string, c idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	s.claims.Add(1)
	if s.claim != nil {
		return s.claim(ctx)
	}
	return s.MemoryStore.Claim(ctx, id, c)
}

// record returns the record stored for a call's key.
func (s *store) record(t *testing.T, scope, method, key string) *idemstore.Record {
	t.Helper()
	rec, err := s.Read(t.Context(), idem.OperationID(idem.KindDo, "", OpKey(scope, method, key)))
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// newServer returns the server part of an interceptor on st, with textCodec.
func newServer(st idemstore.Store, gopts []idem.Option, opts ...option) *Server[string, string] {
	return NewServer(testProtocol, textCodec, idem.New(st, gopts...), opts)
}

// handler is a unary handler: it counts its runs, keeps the Attempt of the
// last, and answers with the payload its answer function returns.
type handler struct {
	mu      sync.Mutex
	runs    int
	attempt *idem.Attempt
	answer  func(ctx context.Context) ([]byte, error)
}

// answering returns a handler that answers every call with the response m.
func answering(m string) *handler {
	return &handler{answer: func(context.Context) ([]byte, error) { return textCodec.RecordMessage(m, true) }}
}

func (h *handler) handle(ctx context.Context) ([]byte, error) {
	a, _ := idem.AttemptFrom(ctx)
	h.mu.Lock()
	h.runs++
	h.attempt = a
	h.mu.Unlock()
	return h.answer(ctx)
}

func (h *handler) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.runs
}

// keyed returns the key header's values for key.
func keyed(key string) []string { return []string{key} }

// syncBuffer is a bytes.Buffer safe for concurrent writes.
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

// captureLog sends slog.Default's records to the returned buffer until the
// test ends. Tests using it do not run in parallel.
func captureLog(t *testing.T) *syncBuffer {
	var buf syncBuffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	return &buf
}
