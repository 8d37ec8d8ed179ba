package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

var _ = register("inspect", func(fs *flag.FlagSet) (func(context.Context, *env) error, bool) {
	o := registerOperationFlags(fs)
	jsonOut := fs.Bool("json", false, "print one JSON object")
	return func(ctx context.Context, e *env) error { return inspect(ctx, e, o, *jsonOut) }, false
})

var _ = register("forget", func(fs *flag.FlagSet) (func(context.Context, *env) error, bool) {
	o := registerOperationFlags(fs)
	force := fs.Bool("force", false, "delete even while a live lease holds the operation (its holder loses it)")
	yes := fs.Bool("yes", false, "really delete; without it, forget shows what it would delete and exits 1")
	return func(ctx context.Context, e *env) error { return forget(ctx, e, o, *force, *yes) }, false
})

// inspection is the output of inspect -json: one object per operation.
type inspection struct {
	Kind        string            `json:"kind"`
	Scope       string            `json:"scope,omitempty"`
	Key         string            `json:"key"`
	ID          string            `json:"id"`
	RecordKey   string            `json:"record_key"`
	LeaseKey    string            `json:"lease_key"`
	State       string            `json:"state"` // absent, in_progress, completed
	Fence       int64             `json:"fence"`
	Held        bool              `json:"held"` // a live lease holds the operation
	Owner       string            `json:"owner,omitempty"`
	LeaseHolder string            `json:"lease_holder,omitempty"`
	LeaseTTLMs  int64             `json:"lease_ttl_ms,omitempty"`
	Fingerprint string            `json:"fingerprint,omitempty"`
	Created     *time.Time        `json:"created,omitempty"`
	TTLMs       int64             `json:"ttl_ms,omitempty"`
	Checkpoints map[string][]byte `json:"checkpoints,omitempty"` // values base64, as encoding/json writes []byte
	Result      *storedResult     `json:"result,omitempty"`
	FoundWith   []string          `json:"found_with,omitempty"` // when absent: the flags under which the key has a record
	Hint        string            `json:"hint,omitempty"`       // when absent: where to look instead
}

type storedResult struct {
	Type    string              `json:"type"`
	Status  int                 `json:"status,omitempty"`
	Headers map[string][]string `json:"headers,omitempty"`
	Size    int                 `json:"size"`
	Error   string              `json:"error,omitempty"`
}

// newInspection converts what the store found.
func newInspection(op operation, in *idem.Inspection) *inspection {
	out := &inspection{Kind: op.kind.String(), Scope: op.scope, Key: op.key, ID: in.ID,
		RecordKey: in.RecordKey, LeaseKey: in.LeaseKey, State: "absent", Held: in.Held(), LeaseHolder: in.LeaseHolder}
	r := in.Record
	if r == nil {
		return out
	}
	out.State = "in_progress"
	if r.State == idemstore.StateCompleted {
		out.State = "completed"
	}
	created := r.Created.UTC()
	out.Fence, out.Owner, out.Fingerprint, out.Created = r.Fence, r.Owner, r.Fingerprint, &created
	out.TTLMs, out.LeaseTTLMs, out.Checkpoints = r.TTL.Milliseconds(), r.LeaseTTL.Milliseconds(), r.Checkpoints
	if res := in.Result; res != nil {
		out.Result = &storedResult{Type: res.Type, Status: res.Status, Headers: res.Header, Size: res.Size, Error: res.Error}
		if op.kind == idem.KindOnce && res.Type == "json" && res.Size == 0 {
			// Once stores no value: only that the id was processed.
			out.Result = &storedResult{Type: "processed"}
		}
	}
	return out
}

// inspect prints one operation.
func inspect(ctx context.Context, e *env, flags *operationFlags, jsonOut bool) error {
	op, err := flags.operation(e)
	if err != nil {
		return err
	}
	in, err := op.store.Inspect(ctx, op.id)
	if err != nil {
		return fmt.Errorf("reading %s: %w", op.recordKey(), err)
	}
	out := newInspection(op, in)
	if err := elsewhere(ctx, op, out); err != nil {
		return err
	}
	if jsonOut {
		enc := json.NewEncoder(e.stdout)
		enc.SetEscapeHTML(false)
		return enc.Encode(out)
	}
	printInspection(e.stdout, out, time.Now())
	return nil
}

// printInspection prints an inspection for people.
func printInspection(w io.Writer, in *inspection, now time.Time) {
	row := func(name, format string, args ...any) {
		fmt.Fprintf(w, "%-12s %s\n", name, fmt.Sprintf(format, args...))
	}
	what := in.Kind + " key " + strconv.Quote(in.Key)
	if in.Scope != "" {
		what += " in scope " + strconv.Quote(in.Scope)
	}
	row("operation", "%s", what)
	row("id", "%s", in.ID)
	row("record", "%s", in.RecordKey)
	switch {
	case in.State == "absent" && in.Held:
		row("state", "absent, but a lease without a record is held by %s", in.LeaseHolder)
		return
	case in.State == "absent":
		row("state", "absent: no record (never used, expired or forgotten); the next request with this key runs as new")
		if in.Hint != "" {
			row("hint", "%s", in.Hint)
		}
		return
	case in.State == "completed":
		row("state", "completed: repeats get the stored result")
	case in.Held:
		row("state", "in_progress, held: an attempt is running; repeats are busy for %v", ms(in.LeaseTTLMs))
	default:
		row("state", "in_progress, not held: released or abandoned; the next request takes over as attempt %d", in.Fence+1)
	}
	row("fence", "%d", in.Fence)
	row("created", "%s (%v ago)", in.Created.Format(time.RFC3339), now.Sub(*in.Created).Round(time.Second))
	row("expires", "in %v", ms(in.TTLMs))
	row("owner", "%s", in.Owner)
	if in.Held {
		row("lease", "held by %s for %v more", in.LeaseHolder, ms(in.LeaseTTLMs))
	} else {
		row("lease", "none")
	}
	row("fingerprint", "%s", in.Fingerprint)
	if r := in.Result; r != nil {
		printResult(row, r)
	}
	if in.State == "in_progress" {
		row("checkpoints", "%d", len(in.Checkpoints))
		for _, name := range slices.Sorted(maps.Keys(in.Checkpoints)) {
			fmt.Fprintf(w, "  %s = %s\n", strconv.Quote(name), quoteValue(in.Checkpoints[name]))
		}
	}
}

func printResult(row func(name, format string, args ...any), r *storedResult) {
	switch r.Type {
	case "response":
		row("result", "HTTP response %d, body %d B", r.Status, r.Size)
	case "response-not-stored":
		row("result", "HTTP response %d too large to store: repeats get a problem saying so", r.Status)
	case "error":
		row("result", "error (idem.Permanent): %s", strconv.Quote(r.Error))
	case "processed":
		row("result", "processed: the id is marked done; redeliveries get ran=false and do not run")
	default:
		row("result", "%s, %d B", r.Type, r.Size)
	}
	for _, name := range slices.Sorted(maps.Keys(r.Headers)) {
		for _, v := range r.Headers[name] {
			row("", "%s: %s", name, v)
		}
	}
}

// quoteValue shows a checkpoint value: quoted, and cut after 200 bytes.
func quoteValue(v []byte) string {
	if len(v) > 200 {
		return strconv.Quote(string(v[:200])) + fmt.Sprintf("... (%d B)", len(v))
	}
	return strconv.Quote(string(v))
}

// ms returns n milliseconds, rounded for people: to the second from a
// minute, else to a tenth of a second.
func ms(n int64) time.Duration {
	d := time.Duration(n) * time.Millisecond
	if d >= time.Minute {
		return d.Round(time.Second)
	}
	return d.Round(100 * time.Millisecond)
}

// forget deletes one operation's record and lease.
func forget(ctx context.Context, e *env, flags *operationFlags, force, yes bool) error {
	op, err := flags.operation(e)
	if err != nil {
		return err
	}
	in, err := op.store.Inspect(ctx, op.id)
	if err != nil {
		return fmt.Errorf("reading %s: %w", op.recordKey(), err)
	}
	found := newInspection(op, in)
	if found.State == "absent" && !found.Held {
		fmt.Fprintf(e.stdout, "nothing to forget: no record at %s\n", in.RecordKey)
		return nil
	}
	if !yes {
		printInspection(e.stdout, found, time.Now())
		return errors.New("not forgotten: pass -yes to delete this record")
	}
	if in.Held() && !force {
		return refusal(found.LeaseTTLMs)
	}
	deleted, err := op.store.Forget(ctx, op.id, force)
	var busy *idem.InProgressError
	switch {
	case errors.As(err, &busy):
		return refusal(busy.RetryAfter.Milliseconds())
	case err != nil:
		return fmt.Errorf("deleting %s: %w", in.RecordKey, err)
	case !deleted:
		fmt.Fprintf(e.stdout, "nothing to forget: the record at %s is gone already\n", in.RecordKey)
		return nil
	}
	state := found.State
	if found.Held {
		state += ", held"
	}
	fmt.Fprintf(e.stdout, "forgot %s (%s, fence %d): the next request with this key runs as new\n", in.RecordKey, state, found.Fence)
	return nil
}

func refusal(leaseMs int64) error {
	return fmt.Errorf("refused: a live lease holds the operation for %v more (an attempt is running); "+
		"wait for it, or pass -force if its holder is dead (a retry may then run alongside it)", ms(leaseMs))
}

// elsewhere looks up an absent operation's key under the other kinds (do,
// once, and http without a scope) and returns the flags that find a record,
// and a hint for people: where the key was found, or that a -scope may be
// missing. It reads only when the operation is absent and not held.
func elsewhere(ctx context.Context, op operation, out *inspection) error {
	if out.State != "absent" || out.Held {
		return nil
	}
	for _, alt := range op.alternatives() {
		in, err := alt.store.Inspect(ctx, alt.id)
		if err != nil {
			return fmt.Errorf("reading %s: %w", alt.recordKey(), err)
		}
		if in.Record != nil || in.Held() {
			out.FoundWith = append(out.FoundWith, alt.flags())
		}
	}
	out.Hint = hint(op, out.FoundWith)
	return nil
}

// alternatives returns the same key under the other kinds: do, once, and
// http without a scope, leaving out op itself. A quoted key is unquoted for
// http, as the middleware reads it.
func (op operation) alternatives() []operation {
	var alts []operation
	for _, kind := range []idem.Kind{idem.KindDo, idem.KindOnce, idem.KindHTTP} {
		if kind == op.kind && (kind != idem.KindHTTP || op.scope == "") {
			continue
		}
		key := op.key
		if kind == idem.KindHTTP && op.kind != idem.KindHTTP && strings.HasPrefix(key, `"`) {
			if k, ok := unquote(key); ok {
				key = k
			}
		}
		alts = append(alts, operation{kind: kind, key: key, id: idem.OperationID(kind, "", key), store: op.store})
	}
	return alts
}

// flags returns the command-line flags that name op's kind and scope.
func (op operation) flags() string {
	if op.scope != "" {
		return fmt.Sprintf("-kind %s -scope %q", op.kind, op.scope)
	}
	return "-kind " + op.kind.String()
}

// hint says where an absent operation's key was found, or why it may not
// have been.
func hint(op operation, found []string) string {
	if len(found) > 0 {
		return fmt.Sprintf("no %s record for this key; found one with %s: idem inspect %s KEY",
			op.kind, strings.Join(found, ", "), found[0])
	}
	if op.kind == idem.KindHTTP && op.scope != "" {
		return "no record for this key under -kind do, once or http without -scope; " +
			"check -scope: it must be what WithScope returns for the request"
	}
	return "no record for this key under -kind do, once or http (without -scope); " +
		"if the middleware uses WithScope, pass -kind http -scope SCOPE (what WithScope returns for the request)"
}
