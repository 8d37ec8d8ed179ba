package idem

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/idemkit/idem/internal/canonjson"
	"github.com/idemkit/idem/internal/jsonptr"
)

// KeyFromJSON returns a function for WithKeyFunc that takes the key from
// the member of a JSON body that pointer names (a JSON Pointer, RFC 6901:
// "/id", "/data/object/id"; "~1" stands for "/" and "~0" for "~" in a name,
// and a number names an array element). Stripe, for one, sends each event
// with its id in "/id". A string member is the key (unescaped); a number
// member is the key as written ("42", not "42.0"). The function returns an
// error, which the middleware answers with 400, when the body is not one
// JSON text (or is nested deeper than 10000), when the pointer names no
// value, when the value is neither a string nor a number, or when an
// object on the way has two members that decoders may take for the one
// named (equal, or differing only in case). An empty string is a missing
// key.
//
// The function reads the body once, in time linear in its length, without
// decoding it. It does not read r, which may be nil, so it also takes keys
// from message payloads (idemwatermill.WithKeyFunc). KeyFromJSON panics if
// pointer is not a JSON Pointer.
func KeyFromJSON(pointer string) func(r *http.Request, body []byte) (string, error) {
	p, err := jsonptr.Parse(pointer)
	if err != nil {
		panic("idem: KeyFromJSON: " + err.Error())
	}
	return func(_ *http.Request, body []byte) (string, error) {
		v, err := findJSON(body, p)
		if err != nil {
			return "", err
		}
		switch jsonptr.KindOf(v) {
		case jsonptr.Number:
			return string(v), nil
		case jsonptr.String:
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				return "", fmt.Errorf("idem: key at %s: %w", pointer, err)
			}
			return s, nil
		}
		return "", fmt.Errorf("idem: key at %s is %s, not a string or a number", displayPointer(pointer), jsonptr.KindOf(v))
	}
}

// FingerprintJSON returns a function for WithFingerprint that fingerprints
// the members of a JSON body that pointers name (JSON Pointers, as
// KeyFromJSON reads them), and nothing else of the body: a repeat whose
// values at those pointers are equal is a repeat, whatever else changed. For
// Stripe's events, FingerprintJSON("/type", "/data") leaves out
// pending_webhooks, which changes between deliveries of one event. Values
// are compared as JSON: member order and whitespace do not matter, numbers
// are compared as written (an object that repeats a member name is compared
// byte for byte, as the default fingerprint does).
//
// The function returns an error, which the middleware answers with 400,
// when the body is not one JSON text or when a pointer names no value (or
// an ambiguous one, as KeyFromJSON says): choose pointers that every request
// of the route carries. It runs in time linear in the body's length for
// each pointer, and does not read r, which may be nil. FingerprintJSON
// panics without pointers or if one is not a JSON Pointer.
func FingerprintJSON(pointers ...string) func(r *http.Request, body []byte) ([]byte, error) {
	if len(pointers) == 0 {
		panic("idem: FingerprintJSON with no pointer")
	}
	ps := make([]jsonptr.Pointer, len(pointers))
	for i, s := range pointers {
		p, err := jsonptr.Parse(s)
		if err != nil {
			panic("idem: FingerprintJSON: " + err.Error())
		}
		ps[i] = p
	}
	return func(_ *http.Request, body []byte) ([]byte, error) {
		if err := jsonptr.Valid(body); err != nil {
			return nil, fmt.Errorf("idem: body is not JSON: %w", err)
		}
		var out []byte
		for _, p := range ps {
			v, err := p.Find(body)
			if err != nil {
				return nil, fmt.Errorf("idem: body: %w", err)
			}
			out = appendField(out, p.String(), v)
		}
		return out, nil
	}
}

// findJSON returns the value p names in body, or an error saying why
// there is none.
func findJSON(body []byte, p jsonptr.Pointer) ([]byte, error) {
	if err := jsonptr.Valid(body); err != nil {
		return nil, fmt.Errorf("idem: body is not JSON: %w", err)
	}
	v, err := p.Find(body)
	if err != nil {
		return nil, fmt.Errorf("idem: body: %w", err)
	}
	return v, nil
}

// appendField appends a named value to a fingerprint: the pointer and the
// value, each after its length, the value in canonical form ('j') or, when
// it has none, as sent ('b').
func appendField(b []byte, pointer string, v []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(pointer)))
	b = append(b, pointer...)
	at := len(b)
	b = append(b, modeJSON, 0, 0, 0, 0)
	out, ok := canonjson.Append(b, v)
	if !ok {
		b[at] = modeBytes
		out = append(b, v...)
	}
	binary.BigEndian.PutUint32(out[at+1:], uint32(len(out)-at-5))
	return out
}

func displayPointer(p string) string {
	if p == "" {
		return "the document"
	}
	return p
}
