package rpcidem

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemstore"
)

// TestRunOnceThenReplay: the first call with a key runs the handler, with
// the Attempt on its context, and its response is stored under the
// operation key of scope, full method and key; a repeat gets the stored
// response and the handler does not run again.
func TestRunOnceThenReplay(t *testing.T) {
	st := newStore()
	s := newServer(st, nil)
	h := answering("receipt-1")

	o := s.Run(t.Context(), methodCharge, "charge 10", keyed("k-1"), h.handle)
	require.Equal(t, Outcome[string, string]{Ran: true}, o)
	require.Equal(t, 1, h.count())
	require.NotNil(t, h.attempt, "the handler's context carries the Attempt")
	require.Equal(t, OpKey("", methodCharge, "k-1"), h.attempt.Key)
	require.EqualValues(t, 1, h.attempt.Fence)
	rec := st.record(t, "", methodCharge, "k-1")
	require.NotNil(t, rec)
	require.Equal(t, idemstore.StateCompleted, rec.State)

	o = s.Run(t.Context(), methodCharge, "charge 10", keyed("k-1"), h.handle)
	require.Equal(t, Outcome[string, string]{Message: "receipt-1"}, o)
	require.Equal(t, 1, h.count(), "a repeat does not run the handler")

	o = s.Run(t.Context(), methodCharge, "charge 10", keyed(`"k-1"`), h.handle)
	require.Equal(t, Outcome[string, string]{Message: "receipt-1"}, o, "a quoted key is the same key")
}

// TestRunStoredAndReleasedErrors: a final error is stored and replayed as
// its status; an error that is not final releases the key, and the next
// call runs the handler again as attempt 2.
func TestRunStoredAndReleasedErrors(t *testing.T) {
	s := newServer(newStore(), nil)
	notFound := &handler{answer: func(context.Context) ([]byte, error) {
		return textCodec.RecordError(errors.New("no such card"), CodeNotFound, "NotFound: no such card")
	}}
	require.True(t, s.Run(t.Context(), methodCharge, "r", keyed("k-nf"), notFound.handle).Ran)
	o := s.Run(t.Context(), methodCharge, "r", keyed("k-nf"), notFound.handle)
	require.Equal(t, Outcome[string, string]{Status: "NotFound: no such card", IsStatus: true}, o)
	require.Equal(t, 1, notFound.count())

	unavailable := &handler{answer: func(context.Context) ([]byte, error) {
		return textCodec.RecordError(errors.New("bank down"), CodeUnavailable, "Unavailable: bank down")
	}}
	for fence := int64(1); fence <= 2; fence++ {
		o := s.Run(t.Context(), methodCharge, "r", keyed("k-un"), unavailable.handle)
		require.Equal(t, Outcome[string, string]{Ran: true}, o)
		require.Equal(t, fence, unavailable.attempt.Fence)
	}
	require.Equal(t, 2, unavailable.count())
}

// TestRunWithoutKey: a call without a key passes through untouched (the
// store is not asked) unless its method is required to carry one; then it
// is refused with InvalidArgument and ReasonKeyMissing. Required methods of
// several options add up.
func TestRunWithoutKey(t *testing.T) {
	st := newStore()
	s := newServer(st, nil,
		func(c *ServerConfig) { c.Require(testProtocol, []string{methodCharge, methodRefund}) },
		func(c *ServerConfig) { c.Require(testProtocol, []string{"/pay.v1.Payments/Capture"}) },
		func(c *ServerConfig) {
			c.SetScope(func(context.Context) string { t.Error("scope asked for a call without key"); return "" })
		},
	)
	h := answering("x")
	for _, m := range []string{methodCharge, methodRefund, "/pay.v1.Payments/Capture"} {
		o := s.Run(t.Context(), m, "r", nil, h.handle)
		require.NotNil(t, o.Refused, m)
		require.Equal(t, Refusal{Code: CodeInvalidArgument, Reason: ReasonKeyMissing,
			Message: "idem: this method needs an idempotency key: create a unique key (a UUID) when the operation is created, send it in the idempotency-key metadata and reuse it on every retry"}, *o.Refused)
	}
	o := s.Run(t.Context(), "/pay.v1.Payments/Get", "r", nil, h.handle)
	require.Equal(t, Outcome[string, string]{Pass: true}, o)
	require.Zero(t, h.count())
	require.Zero(t, st.claims.Load(), "the store is not asked")
}

// TestRunInvalidKey: a key that is empty, too long, not printable ASCII or
// sent twice, from the header or from the key function, is refused with
// InvalidArgument and ReasonKeyInvalid, before the store is asked.
func TestRunInvalidKey(t *testing.T) {
	st := newStore()
	fromFunc := ""
	s := newServer(st, nil, func(c *ServerConfig) {
		c.SetKeyFunc(func(context.Context, any) (string, bool) { return fromFunc, fromFunc != "" })
	})
	h := answering("x")
	refused := func(values []string) *Refusal {
		o := s.Run(t.Context(), methodCharge, "r", values, h.handle)
		require.NotNil(t, o.Refused, "%q", values)
		require.Equal(t, CodeInvalidArgument, o.Refused.Code)
		require.Equal(t, ReasonKeyInvalid, o.Refused.Reason)
		require.Contains(t, o.Refused.Message, "; send 1 to 255 printable ASCII characters, a UUID is recommended")
		return o.Refused
	}
	require.Contains(t, refused([]string{"k-1", "k-2"}).Message, "idempotency-key sent 2 times")
	refused([]string{""})
	refused([]string{"caf\xc3\xa9"})
	refused([]string{strings.Repeat("k", 256)})
	for _, bad := range []string{"line\nbreak", "caf\xc3\xa9", strings.Repeat("k", 300)} {
		fromFunc = bad
		refused(keyed("good-key"))
	}
	require.Zero(t, h.count())
	require.Zero(t, st.claims.Load())
}

// TestRunKeyFunc: the key function's key, when it reports one, is the
// call's key whatever the header says; when it reports none, the header's
// key is used. It sees the request.
func TestRunKeyFunc(t *testing.T) {
	var seen any
	s := newServer(newStore(), nil, func(c *ServerConfig) {
		c.SetKeyFunc(func(_ context.Context, req any) (string, bool) {
			seen = req
			if req == "with request_id" {
				return "req-7", true
			}
			return "", false
		})
	})
	h := answering("x")
	require.True(t, s.Run(t.Context(), methodCharge, "with request_id", keyed("header-key"), h.handle).Ran)
	require.Equal(t, "with request_id", seen)
	require.Equal(t, OpKey("", methodCharge, "req-7"), h.attempt.Key)

	require.True(t, s.Run(t.Context(), methodCharge, "plain", keyed("header-key"), h.handle).Ran)
	require.Equal(t, OpKey("", methodCharge, "header-key"), h.attempt.Key)

	require.Equal(t, Outcome[string, string]{Pass: true}, s.Run(t.Context(), methodCharge, "plain", nil, h.handle))
}

type tenantKey struct{}

// TestRunScope: keys are per scope, so one key sent by two scopes makes two
// operations; a scope function that returns "" refuses the call with
// Internal and ReasonScopeMissing, logged, before the store is asked.
func TestRunScope(t *testing.T) {
	log := captureLog(t)
	st := newStore()
	s := newServer(st, nil, func(c *ServerConfig) {
		c.SetScope(func(ctx context.Context) string { v, _ := ctx.Value(tenantKey{}).(string); return v })
	})
	h := answering("x")
	for _, tenant := range []string{"t1", "t2"} {
		ctx := context.WithValue(t.Context(), tenantKey{}, tenant)
		require.True(t, s.Run(ctx, methodCharge, "r", keyed("k-1"), h.handle).Ran, tenant)
		require.Equal(t, OpKey(tenant, methodCharge, "k-1"), h.attempt.Key)
		require.NotNil(t, st.record(t, tenant, methodCharge, "k-1"))
	}
	require.Equal(t, 2, h.count())

	claims := st.claims.Load()
	o := s.Run(t.Context(), methodCharge, "r", keyed("k-1"), h.handle)
	require.Equal(t, &Refusal{Code: CodeInternal, Reason: ReasonScopeMissing,
		Message: "idem: the server could not tell which account this call's idempotency key belongs to, so the call was not run"}, o.Refused)
	require.Equal(t, claims, st.claims.Load(), "the store is not asked")
	require.Equal(t, 2, h.count())
	require.Contains(t, log.String(), "rpctest: call refused: WithScope returned an empty scope")
	require.Contains(t, log.String(), "method="+methodCharge)
}

// TestRunSameKeyOtherCall: the same key with another request is refused
// with InvalidArgument and ReasonKeyReused; with another method it is
// another operation, and the handler runs.
func TestRunSameKeyOtherCall(t *testing.T) {
	s := newServer(newStore(), nil)
	h := answering("x")
	require.True(t, s.Run(t.Context(), methodCharge, "amount=1", keyed("k-1"), h.handle).Ran)
	o := s.Run(t.Context(), methodCharge, "amount=2", keyed("k-1"), h.handle)
	require.NotNil(t, o.Refused)
	require.Equal(t, CodeInvalidArgument, o.Refused.Code)
	require.Equal(t, ReasonKeyReused, o.Refused.Reason)
	require.Contains(t, o.Refused.Message, "already used with a different request")
	require.Equal(t, 1, h.count())

	require.True(t, s.Run(t.Context(), methodRefund, "amount=1", keyed("k-1"), h.handle).Ran)
	require.Equal(t, 2, h.count())
}

// TestRunBadRequestOrCodec: a request that is not a message, or one that
// does not encode, is refused with Internal before the store is asked.
func TestRunBadRequestOrCodec(t *testing.T) {
	st := newStore()
	h := answering("x")
	o := newServer(st, nil).Run(t.Context(), methodCharge, 42, keyed("k-1"), h.handle)
	require.Equal(t, &Refusal{Code: CodeInternal, Message: "idem: request of type int is not a protocol buffer message"}, o.Refused)

	failing := *textCodec
	failing.Marshal = func([]byte, string) ([]byte, error) { return nil, errors.New("invalid UTF-8") }
	s := NewServer[string, string, option](testProtocol, &failing, newServer(st, nil).g, nil)
	o = s.Run(t.Context(), methodCharge, "r", keyed("k-1"), h.handle)
	require.Equal(t, &Refusal{Code: CodeInternal, Message: "idem: encoding the request: invalid UTF-8"}, o.Refused)
	require.Zero(t, h.count())
	require.Zero(t, st.claims.Load())
}

// TestRunStoredAnswerUnreadable: a repeat whose stored answer does not
// decode is refused with Internal and ReasonStoredUnreadable, logged, and
// the handler does not run again.
func TestRunStoredAnswerUnreadable(t *testing.T) {
	log := captureLog(t)
	s := newServer(newStore(), nil)
	h := &handler{answer: func(context.Context) ([]byte, error) { return []byte("?not a payload"), nil }}
	require.True(t, s.Run(t.Context(), methodCharge, "r", keyed("k-1"), h.handle).Ran)
	o := s.Run(t.Context(), methodCharge, "r", keyed("k-1"), h.handle)
	require.NotNil(t, o.Refused)
	require.Equal(t, CodeInternal, o.Refused.Code)
	require.Equal(t, ReasonStoredUnreadable, o.Refused.Reason)
	require.Contains(t, o.Refused.Message, "do not retry it")
	require.Equal(t, 1, h.count())
	require.Contains(t, log.String(), "rpctest: stored answer does not decode")
	require.Contains(t, log.String(), "unknown payload tag")
}
