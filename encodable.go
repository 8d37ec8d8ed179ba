package idem

import (
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"sync"
)

// encodableTypes caches the verdict of resultType per type.
var encodableTypes sync.Map // reflect.Type → error (nil: encodable)

// resultType returns an error when no value of type t can ever be stored
// as JSON: Do checks it before the claim, so that a function whose result
// could never be recorded does not run its side effect. Types whose values
// may or may not encode (interfaces, types with their own MarshalJSON) pass;
// such a value that fails at run time is recorded as a Permanent error.
func resultType(t reflect.Type) error {
	if v, ok := encodableTypes.Load(t); ok {
		err, _ := v.(error)
		return err
	}
	var err error
	if bad := unencodable(t, map[reflect.Type]bool{}); bad != "" {
		err = fmt.Errorf("idem: result type %v cannot be stored as JSON: %s", t, bad)
	}
	encodableTypes.Store(t, err)
	return err
}

var (
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
)

// marshals reports whether t (or *t) encodes itself.
func marshals(t reflect.Type) bool {
	pt := reflect.PointerTo(t)
	return t.Implements(jsonMarshaler) || pt.Implements(jsonMarshaler) ||
		t.Implements(textMarshaler) || pt.Implements(textMarshaler)
}

// unencodable describes why encoding/json refuses every value of t, or
// returns "" when some value of t encodes. seen breaks recursive types.
func unencodable(t reflect.Type, seen map[reflect.Type]bool) string {
	if seen[t] || marshals(t) {
		return ""
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.Chan, reflect.Func, reflect.Complex64, reflect.Complex128, reflect.UnsafePointer:
		return fmt.Sprintf("encoding/json cannot encode a %v", t)
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return unencodable(t.Elem(), seen)
	case reflect.Map:
		switch t.Key().Kind() {
		case reflect.String, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		default:
			if !t.Key().Implements(textMarshaler) {
				return fmt.Sprintf("a map key of type %v", t.Key())
			}
		}
		return unencodable(t.Elem(), seen)
	case reflect.Struct:
		for f := range t.Fields() {
			if !f.IsExported() && !f.Anonymous || f.Tag.Get("json") == "-" {
				continue
			}
			if bad := unencodable(f.Type, seen); bad != "" {
				return "field " + f.Name + ": " + bad
			}
		}
	}
	return ""
}
