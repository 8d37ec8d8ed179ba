package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/idemkit/idem"
)

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
