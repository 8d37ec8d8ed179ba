package idem

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idemkit/idem/idemstore"
	"github.com/redis/go-redis/v9"
)

// The operator's side of the Redis store: naming an operation from what a
// user knows, reading its record, and forgetting it. cmd/idem is its command
// line.

var (
	//go:embed lua/forget.lua
	forgetLua    string
	forgetScript = newScript(forgetLua)
)

// Inspection is what Inspect finds of one operation.
type Inspection struct {
	ID        string // the operation's id
	RecordKey string // the Redis key of its record
	LeaseKey  string // the Redis key of its lease

	// Record is the stored record, or nil when there is none: the key was
	// never used, its record expired, or it was forgotten.
	Record *idemstore.Record
	// LeaseHolder is the owner token held by the lease key, "" when no lease
	// is live. While an attempt runs it equals Record.Owner.
	LeaseHolder string
	// Result describes the payload of a completed record: what a repeat
	// gets. It is nil for other records.
	Result *StoredResult
}

// Held reports whether a live lease holds the operation: an attempt is
// running (or froze and has not lost its lease yet), and a repeat is busy
// for Record.LeaseTTL. A record in progress that is not held was released
// or abandoned by its holder: the next claim takes it over with Fence+1
// and its checkpoints.
func (in *Inspection) Held() bool { return in.LeaseHolder != "" }

// StoredResult describes the payload of a completed record.
type StoredResult struct {
	// Type says what the payload holds:
	//
	//	"response"            an HTTP response stored by Guard.Middleware
	//	"response-not-stored" an HTTP response too large to store: repeats
	//	                      get a problem with its status (Status); Size is 0
	//	"json"                a value Do stored as JSON; Once's mark of a
	//	                      processed id (Size 0)
	//	"bytes", "string"     a []byte or string result of Do, stored as is
	//	"error"               an error stored by Permanent (Error)
	//	"unknown"             a payload of a format this version cannot read
	Type   string
	Size   int         // bytes of the response body, the value or the error message
	Status int         // the status code of a response
	Header http.Header // the stored headers of a response
	Error  string      // the message of a stored error
}

// Inspect reads the operation with the given id (OperationID, Attempt.ID):
// its record as Read returns it, the lease's holder, and what a completed
// record replays. It reads a consistent snapshot in one round trip (a
// MULTI/EXEC of four reads on the operation's slot) and writes nothing. An
// absent record is not an error: Inspection.Record is nil. It returns
// ErrStoreUnavailable for a store that cannot work, the client's error when
// Redis cannot be reached, and an error for a record it cannot read.
func (s *RedisStore) Inspect(ctx context.Context, id string) (*Inspection, error) {
	if err := s.usable(); err != nil {
		return nil, err
	}
	keys := s.keys(id)
	in := &Inspection{ID: id, RecordKey: keys[0], LeaseKey: keys[1]}
	var get, holder *redis.StringCmd
	var ttl, lttl *redis.DurationCmd
	_, err := s.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		get = p.Get(ctx, keys[0])
		ttl = p.PTTL(ctx, keys[0])
		holder = p.Get(ctx, keys[1])
		lttl = p.PTTL(ctx, keys[1])
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	in.LeaseHolder = holder.Val() // "" when there is no lease
	if strings.HasPrefix(in.LeaseHolder, "~") {
		in.LeaseHolder = "" // a tombstone (unclaim.lua) is no lease
	}
	if errors.Is(get.Err(), redis.Nil) {
		return in, nil
	}
	if in.Record, err = decodeRecord(get.Val()); err != nil {
		return nil, fmt.Errorf("%w (%s)", err, keys[0])
	}
	in.Record.TTL = max(ttl.Val(), 0)
	if in.LeaseHolder != "" {
		in.Record.LeaseTTL = max(lttl.Val(), 0)
	}
	if in.Record.State == idemstore.StateCompleted {
		in.Result = describePayload(in.Record.Payload)
	}
	return in, nil
}

// Read implements idemstore.Reader: Inspect's record, nil when there is none.
func (s *RedisStore) Read(ctx context.Context, id string) (*idemstore.Record, error) {
	in, err := s.Inspect(ctx, id)
	if err != nil {
		return nil, err
	}
	return in.Record, nil
}

// describePayload tells what a completed record's payload holds: a response
// stored by the middleware, or a result stored by Do or Once. Their tags
// differ, so the payload alone decides.
func describePayload(p []byte) *StoredResult {
	if len(p) == 0 {
		return &StoredResult{Type: "unknown"}
	}
	switch p[0] {
	case payloadResponse, payloadTooLarge:
		resp, err := decodeResponse(p)
		if err != nil {
			return &StoredResult{Type: "unknown", Size: len(p)}
		}
		r := &StoredResult{Type: "response", Status: resp.status, Size: len(resp.body), Header: http.Header{}}
		if resp.tooLarge {
			r.Type, r.Size = "response-not-stored", 0
		}
		for _, h := range resp.headers {
			r.Header[h.name] = append(r.Header[h.name], h.value)
		}
		return r
	case payloadValue:
		return &StoredResult{Type: "json", Size: len(p) - 1}
	case payloadBytes:
		return &StoredResult{Type: "bytes", Size: len(p) - 1}
	case payloadString:
		return &StoredResult{Type: "string", Size: len(p) - 1}
	case payloadError:
		return &StoredResult{Type: "error", Size: len(p) - 1, Error: string(p[1:])}
	}
	return &StoredResult{Type: "unknown", Size: len(p)}
}

// Forget deletes the record and the lease of the operation with the given
// id, in one atomic script, so that the key runs again on its next request
// as a new operation (Fence 1, no checkpoints): use it to clear a stored
// result that must not be replayed, such as a 4xx cached by mistake. It
// reports whether there was anything to delete.
//
// While a live lease holds the operation, Forget refuses with an
// *InProgressError (ErrInProgress) carrying the lease's remaining time,
// unless force is set. Forcing it makes the running attempt lose its lease:
// its heartbeat cancels its function with ErrLeaseLost and its result is not
// stored, but a side effect it already made stays made, and a retry may run
// alongside it, at Fence 1 again, so that a downstream fencing check cannot
// tell the two apart. Force only a holder known to be dead or stuck.
//
// With WithReplicaAck, Forget waits for the replicas like every write, and
// returns an error when too few acknowledged it (the deletion happened on
// the primary). Other errors are those of Inspect.
func (s *RedisStore) Forget(ctx context.Context, id string, force bool) (bool, error) {
	if err := s.usable(); err != nil {
		return false, err
	}
	flag := "0"
	if force {
		flag = "1"
	}
	c := s.call(forgetScript, id, true, true)
	c.text(flag)
	cmd, ackErr := s.eval(ctx, c)
	v, err := cmd.Int64Slice()
	switch {
	case err != nil:
		return false, err
	case len(v) == 2 && v[0] == -1:
		return false, &InProgressError{RetryAfter: time.Duration(max(v[1], 0)) * time.Millisecond}
	case len(v) != 1 || v[0] < 0:
		return false, fmt.Errorf("idem: unexpected forget reply %v", v)
	}
	return v[0] > 0, ackErr
}
