package idem

import (
	"encoding/json"
	"net/http"

	"github.com/idemkit/idem/internal/wire"
)

// problemBase is where the problem types are explained.
const problemBase = "https://github.com/idemkit/idem/blob/main/docs/http.md#"

// problemKind is a kind of problem (RFC 9457) the middleware answers with.
// The type URIs are part of the contract: clients (idemclient.NewTransport
// among them) match them.
type problemKind struct {
	status int
	typ    string
	title  string
}

var (
	probKeyMissing        = problemKind{http.StatusBadRequest, problemBase + "key-missing", "Idempotency key missing"}
	probKeyInvalid        = problemKind{http.StatusBadRequest, problemBase + "key-invalid", "Idempotency key invalid"}
	probBodyUnreadable    = problemKind{http.StatusBadRequest, problemBase + "body-unreadable", "Request body unreadable"}
	probBodyTooLarge      = problemKind{http.StatusRequestEntityTooLarge, problemBase + "body-too-large", "Request body too large"}
	probFingerprintFailed = problemKind{http.StatusBadRequest, problemBase + "fingerprint-failed", "Request fingerprint failed"}
	probKeyReused         = problemKind{http.StatusUnprocessableEntity, problemBase + "key-reused", "Idempotency key reused"}
	probInProgress        = problemKind{http.StatusConflict, wire.InProgressProblem, "Request in progress"}
	probUnavailable       = problemKind{http.StatusServiceUnavailable, problemBase + "store-unavailable", "Idempotency store unavailable"}
	probStoredUnreadable  = problemKind{http.StatusInternalServerError, problemBase + "response-unreadable", "Stored response unreadable"}
	probScopeMissing      = problemKind{http.StatusInternalServerError, problemBase + "scope-missing", "Idempotency scope missing"}
)

// storedUnreadableDetail is the detail of a stored response, or the record
// of an earlier attempt, that the server cannot read back: it does not
// decode, does not open under the server's sealing keys (WithSealer), or
// is keyed with a key the server no longer lists.
const storedUnreadableDetail = "This request was already processed, or started, but its stored record cannot be read by the server (it does not decode or does not open under the server's keys), so it was not processed again. Do not retry it; look up the outcome of the operation instead."

type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

func (p problem) marshal() []byte {
	b, _ := json.Marshal(p) // strings and an int: cannot fail
	return b
}

// writeProblem answers with a problem of kind k.
func writeProblem(w http.ResponseWriter, k *problemKind, detail string) {
	h := w.Header()
	h.Set("Content-Type", wire.ProblemContentType)
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(k.status)
	_, _ = w.Write(problem{Type: k.typ, Title: k.title, Status: k.status, Detail: detail}.marshal())
}
