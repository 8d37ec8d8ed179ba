package idemwatermill_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemwatermill"
)

// eventKey and eventFP read a Stripe-style event payload: its id, and
// its type and data (not its attempt count).
var (
	eventID    = idem.KeyFromJSON("/id")
	eventPrint = idem.FingerprintJSON("/type", "/data")
	eventKey   = idemwatermill.WithKeyFunc(func(m *message.Message) (string, error) { return eventID(nil, m.Payload) })
	eventFP    = idemwatermill.WithFingerprint(func(m *message.Message) ([]byte, error) { return eventPrint(nil, m.Payload) })
)

func event(id string, amount, attempt int) []byte {
	return fmt.Appendf(nil, `{"id":%q,"type":"charge.succeeded","attempt":%d,"data":{"amount":%d}}`, id, attempt, amount)
}

// TestKeyFromPayload: an event relayed with a new UUID on each delivery,
// and another attempt count, is a redelivery of one event; another amount
// under its id is a mismatch.
func TestKeyFromPayload(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		c := &charger{}
		h := idemwatermill.Middleware(b.Guard(), eventKey, eventFP)(c.handle)
		first, err := h(message.NewMessage("uuid-1", event("evt_1", 1000, 1)))
		require.NoError(t, err)
		again, err := h(message.NewMessage("uuid-2", event("evt_1", 1000, 2)))
		require.NoError(t, err)
		require.Equal(t, brief(first), brief(again))
		_, err = h(message.NewMessage("uuid-3", event("evt_1", 2000, 3)))
		require.ErrorIs(t, err, idem.ErrMismatch)
		_, err = h(message.NewMessage("uuid-4", event("evt_2", 1000, 1)))
		require.NoError(t, err)
		require.Equal(t, int32(2), c.runs.Load())
	})
}

// TestKeyFuncWithoutFingerprint: the whole payload is compared by default,
// so a changed attempt count is a mismatch.
func TestKeyFuncWithoutFingerprint(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		c := &charger{}
		h := idemwatermill.Middleware(b.Guard(), eventKey)(c.handle)
		_, err := h(message.NewMessage("uuid-1", event("evt_1", 1000, 1)))
		require.NoError(t, err)
		_, err = h(message.NewMessage("uuid-2", event("evt_1", 1000, 2)))
		require.ErrorIs(t, err, idem.ErrMismatch)
	})
}

func TestKeyFuncRefusals(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		c := &charger{}
		h := idemwatermill.Middleware(b.Guard(), eventKey, eventFP)(c.handle)
		tests := []struct {
			name, payload string
			is            error
			msg           string
		}{
			{name: "not JSON", payload: `order 42`, is: idemwatermill.ErrNoKey, msg: "body is not JSON"},
			{name: "no id", payload: `{"type":"x","data":{}}`, is: idemwatermill.ErrNoKey, msg: "/id: no such member"},
			{name: "empty id", payload: `{"id":"","type":"x","data":{}}`, is: idemwatermill.ErrNoKey, msg: "found none"},
			{name: "id not ASCII", payload: `{"id":"é","type":"x","data":{}}`, is: idem.ErrInvalidKey},
			{name: "no data", payload: `{"id":"evt_3","type":"x"}`, msg: "fingerprint: idem: body: /data: no such member"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				_, err := h(message.NewMessage("uuid-1", []byte(tt.payload)))
				require.Error(t, err)
				if tt.is != nil {
					require.ErrorIs(t, err, tt.is)
				}
				require.ErrorContains(t, err, tt.msg)
			})
		}
		ownErr := errors.New("no event id")
		_, err := idemwatermill.Middleware(b.Guard(), idemwatermill.WithKeyFunc(func(*message.Message) (string, error) {
			return "", ownErr
		}))(c.handle)(message.NewMessage("uuid-1", nil))
		require.ErrorIs(t, err, idemwatermill.ErrNoKey)
		require.ErrorIs(t, err, ownErr)
		require.Zero(t, c.runs.Load())
	})
}

func TestKeyFuncOptionsRejected(t *testing.T) {
	g := idem.New(nil)
	require.PanicsWithValue(t, "idemwatermill: Middleware: WithKeyMetadata and WithKeyFunc: the key is taken from one place; give one of them",
		func() { idemwatermill.Middleware(g, idemwatermill.WithKeyMetadata("order_id"), eventKey) })
	require.PanicsWithValue(t, "idemwatermill: WithKeyFunc(nil)", func() { idemwatermill.Middleware(g, idemwatermill.WithKeyFunc(nil)) })
	require.PanicsWithValue(t, "idemwatermill: WithFingerprint(nil)", func() { idemwatermill.Middleware(g, idemwatermill.WithFingerprint(nil)) })
}
