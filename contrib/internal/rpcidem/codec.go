package rpcidem

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/idemkit/idem"
)

// Codec is what the shared code needs of protocol buffers, given by each
// module: M is proto.Message and S is *status.Status of
// google.golang.org/genproto/googleapis/rpc/status (google.rpc.Status). The
// functions must encode deterministically: a fingerprint is a hash of what
// Marshal returns.
type Codec[M, S any] struct {
	// Marshal appends m's deterministic encoding to b.
	Marshal func(b []byte, m M) ([]byte, error)
	// MarshalStatus appends st's deterministic encoding to b.
	MarshalStatus func(b []byte, st S) ([]byte, error)
	// MarshalAny appends the deterministic encoding of a google.protobuf.Any
	// holding m (its type URL and deterministic encoding) to b.
	MarshalAny func(b []byte, m M) ([]byte, error)
	// UnmarshalAny returns a new message holding what an encoded
	// google.protobuf.Any holds; its type must be linked into the program
	// (protoregistry.GlobalTypes), as every generated message type is.
	UnmarshalAny func(b []byte) (M, error)
	// UnmarshalStatus decodes a status.
	UnmarshalStatus func(b []byte) (S, error)
}

// Fingerprint returns what idem.Do fingerprints for a call: the SHA-256 of
// the full method and the request's deterministic protobuf encoding.
func (c *Codec[M, S]) Fingerprint(method string, req M) (string, error) {
	body, err := c.Marshal(nil, req)
	if err != nil {
		return "", fmt.Errorf("encoding the request: %w", err)
	}
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(method)))
	h.Write(n[:])
	h.Write([]byte(method))
	h.Write(body)
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil)), nil
}

// Tags of the stored payload: a response message, or a status.
const (
	tagMessage byte = 'm' // a google.protobuf.Any holding the response
	tagStatus  byte = 's' // a google.rpc.Status
)

// ErrRelease is what the function given to idem.Do returns for an answer
// that must not be stored: the key is released.
var ErrRelease = errors.New("idem: answer not stored")

// EncodeMessage returns the payload storing a response: its type URL and
// deterministic encoding, in a google.protobuf.Any.
func (c *Codec[M, S]) EncodeMessage(m M) ([]byte, error) {
	return c.MarshalAny([]byte{tagMessage}, m)
}

// EncodeStatus returns the payload storing an error: code, message and
// details.
func (c *Codec[M, S]) EncodeStatus(st S) ([]byte, error) {
	return c.MarshalStatus([]byte{tagStatus}, st)
}

// RecordMessage returns the payload storing a handler's response, or
// ErrRelease when there is no message to store (ok false: nil, or not a
// protocol buffer message, which the protocol fails anyway).
func (c *Codec[M, S]) RecordMessage(m M, ok bool) ([]byte, error) {
	if !ok {
		return nil, ErrRelease
	}
	return c.EncodeMessage(m)
}

// RecordError returns the payload storing a handler's error, whose status
// is st with code code, when that is the call's final answer (StoredCode,
// or an error wrapped by idem.Permanent); else ErrRelease.
func (c *Codec[M, S]) RecordError(err error, code uint32, st S) ([]byte, error) {
	if StoredCode(code) || errors.Is(err, idem.ErrPermanent) {
		return c.EncodeStatus(st)
	}
	return nil, ErrRelease
}

// Decode returns the stored response, or the stored status (isStatus).
func (c *Codec[M, S]) Decode(p []byte) (m M, st S, isStatus bool, err error) {
	if len(p) == 0 {
		return m, st, false, errors.New("empty payload")
	}
	switch p[0] {
	case tagMessage:
		m, err = c.UnmarshalAny(p[1:])
		return m, st, false, err
	case tagStatus:
		st, err = c.UnmarshalStatus(p[1:])
		return m, st, true, err
	}
	return m, st, false, fmt.Errorf("unknown payload tag %q", p[0])
}
