package idem

import (
	"bytes"
	"encoding/json"
	"reflect"
	"sync"
)

// decodeValue decodes data, a stored JSON result, into a T, and reports
// whether it did (see decodeJSON). JSON decodes into a value it gets as an
// any, which puts the value on the heap: the values of each result type are
// taken from a pool, and a decoded one is copied out.
func decodeValue[T any](data []byte) (v T, ok bool) {
	t := reflect.TypeFor[T]()
	pl, found := decodeTargets.Load(t)
	if !found {
		pl, _ = decodeTargets.LoadOrStore(t, &pool[*T]{fresh: func() *T { return new(T) }})
	}
	kept := pl.(*pool[*T])
	p := kept.get()
	ok = decodeJSON(data, p)
	if ok {
		v = *p
	}
	var zero T
	*p = zero // holds nothing of a result once back in the pool
	kept.put(p)
	return v, ok
}

// decodeTargets are the pools of decodeValue, by result type.
var decodeTargets sync.Map // reflect.Type → *pool[*T]

// jsonDecoder decodes stored results, reused across replays: json.Unmarshal
// makes a decoder's state (and the state of the error it would report) on
// every call, three or four allocations per replay; a json.Decoder keeps
// them.
type jsonDecoder struct {
	r   bytes.Reader
	dec *json.Decoder
}

var jsonDecoders = pool[*jsonDecoder]{fresh: func() *jsonDecoder {
	d := new(jsonDecoder)
	d.dec = json.NewDecoder(&d.r)
	return d
}}

// decodeJSON decodes data, one JSON value as encodeResult stores it (no
// space around it), into v, and reports whether it did. It does not when
// data is anything else, such as a value with other bytes after it, which
// json.Unmarshal refuses and a json.Decoder would leave for the next value;
// its caller then decodes with json.Unmarshal, whose result and error are
// the reference, into a v it has zeroed again.
func decodeJSON(data []byte, v any) bool {
	if len(data) == 0 || space(data[0]) || space(data[len(data)-1]) {
		return false
	}
	d := jsonDecoders.get()
	d.r.Reset(data)
	start := d.dec.InputOffset()
	err := d.dec.Decode(v)
	// A decoder that read all of data and nothing else is left as it was
	// taken (every byte it read consumed) and goes back to the pool.
	ok := err == nil && d.dec.InputOffset()-start == int64(len(data)) && d.r.Len() == 0
	d.r.Reset(nil)
	if ok && len(data) <= maxPooledBuffer {
		jsonDecoders.put(d)
	}
	return ok
}

// space reports whether c is JSON white space.
func space(c byte) bool {
	return c == ' ' || c == '\t' || c == '\r' || c == '\n'
}
