package idemgrpc

import (
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemkit/idem/contrib/internal/rpcidem"
)

// deterministic encodes what is fingerprinted and stored, so that equal
// messages encode equally.
var deterministic = proto.MarshalOptions{Deterministic: true}

// codec gives the shared implementation (the same as idemconnect's, so that
// a service served by both shares its records) the protobuf functions it
// needs.
var codec = &rpcidem.Codec[proto.Message, *spb.Status]{
	Marshal:         deterministic.MarshalAppend,
	MarshalStatus:   func(b []byte, st *spb.Status) ([]byte, error) { return deterministic.MarshalAppend(b, st) },
	MarshalAny:      marshalAny,
	UnmarshalAny:    unmarshalAny,
	UnmarshalStatus: unmarshalStatus,
}

func marshalAny(b []byte, m proto.Message) ([]byte, error) {
	var a anypb.Any
	if err := anypb.MarshalFrom(&a, m, deterministic); err != nil {
		return nil, err
	}
	return deterministic.MarshalAppend(b, &a)
}

func unmarshalAny(b []byte) (proto.Message, error) {
	var a anypb.Any
	if err := proto.Unmarshal(b, &a); err != nil {
		return nil, err
	}
	return anypb.UnmarshalNew(&a, proto.UnmarshalOptions{})
}

func unmarshalStatus(b []byte) (*spb.Status, error) {
	var st spb.Status
	if err := proto.Unmarshal(b, &st); err != nil {
		return nil, err
	}
	return &st, nil
}
