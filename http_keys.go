package idem

import (
	"net/http"
	"strings"

	"github.com/idemkit/idem/internal/wire"
)

// The key and the fingerprint taken from the request by functions the
// application gives (WithKeyFunc, WithFingerprint): for webhook receivers,
// whose senders name each delivery in a header or a body field of their
// own, and for APIs that compare only the parts of a request that matter.

// WithKeyFunc takes each request's key from the request itself instead of
// a header: f returns the key, given the request and its body. body is the
// whole request body, read by the middleware as the handler gets it (up to
// WithMaxRequestBody: a larger body gets 413 before f runs); f must not
// modify it nor keep it after it returns, and must not read r.Body. The
// handler still reads the whole body from r.Body.
//
// The key f returns is validated as a header's key is (1 to 255 printable
// ASCII bytes; it is used as it is, never unquoted) and scoped by WithScope
// as a header's key is. What a request gets:
//
//   - f returns an error: 400 with a problem of type
//     docs/http.md#key-invalid whose detail gives the error's text; the
//     handler does not run and the store is not asked.
//   - f returns "": the key is missing: 400 (docs/http.md#key-missing), or,
//     with WithOptionalKey, the handler runs unprotected, with the body.
//   - a key that is not valid: 400 (docs/http.md#key-invalid).
//
// On such a route the body is read before the key is known, also on
// routes with WithOptionalKey, and WithScope's function runs once the key
// is valid, after the body was read. KeyFromJSON returns such a function
// for a member of a JSON body. Give each route its own WithScope (or put
// the route in the key) when one sender's ids may reach two routes of one
// Guard: keys are not tied to a route, and the fingerprint (which holds
// the path) would answer the second route with 422.
//
// WithKeyFunc cannot be combined with WithKeyHeader (Middleware panics);
// a nil f makes Middleware panic.
func WithKeyFunc(f func(r *http.Request, body []byte) (string, error)) HTTPOption {
	return func(c *httpConfig) {
		if f == nil {
			c.fail("WithKeyFunc(nil)")
		}
		c.keyFunc = f
	}
}

// WithFingerprint sets what is compared between requests with one key:
// the bytes f returns for the request, given its body (the whole body, as
// WithKeyFunc gets it, under the same rules: f must not modify or keep it).
// A repeat whose bytes are equal to the first request's is answered with
// the first response; other bytes get 422. The default compares the query
// and the whole body (canonical JSON for a JSON body); f replaces those:
// the method and path stay in the fingerprint, so a key reused on another
// route is still refused. Use it to leave out what a sender changes on
// each delivery of one event (Stripe's pending_webhooks, a delivery
// timestamp): FingerprintJSON returns such a function for chosen members of
// a JSON body.
//
// An error from f is answered with 400 and a problem of type
// docs/http.md#fingerprint-failed whose detail gives the error's text; the
// handler does not run and the store is not asked. The fingerprint is
// stored as a hash, keyed by the Sealer's fingerprint keys with WithSealer,
// as the default one is. A nil f makes Middleware panic.
func WithFingerprint(f func(r *http.Request, body []byte) ([]byte, error)) HTTPOption {
	return func(c *httpConfig) {
		if f == nil {
			c.fail("WithFingerprint(nil)")
		}
		c.fingerprint = f
	}
}

// modeFunc marks a fingerprint whose body part WithFingerprint's function
// gave: never equal to one of the default's.
const modeFunc byte = 'f'

// serveKeyFunc serves a protected request on a route with WithKeyFunc: it
// reads the body, takes the key from the request, then goes on as with a
// header's key.
func (h *idemHandler) serveKeyFunc(w http.ResponseWriter, r *http.Request) {
	m := h.m
	bp := bodyBuffers.get()
	body, status := readBody(r, m.maxRequest, (*bp)[:0])
	var (
		key string
		err error
	)
	if status == 0 {
		key, err = m.keyFunc(r, body[:len(body):len(body)])
		if err == nil && key == "" && m.optional {
			h.pass(w, r, bp, body)
			return
		}
	}
	ctx, ob := m.g.observe(r.Context(), KindHTTP)
	if ob != nil {
		r = r.WithContext(ctx)
		defer ob.abort()
	}
	refused := m.bodyRefused(w, status)
	if refused == "" && !m.funcKeyValid(w, key, err) {
		refused = OutcomeInvalidKey
	}
	var scope string
	var fp print128
	if refused == "" {
		var ok bool
		if scope, ok = m.scopeOf(w, r); !ok {
			refused = OutcomeInvalidKey
		}
	}
	if refused == "" {
		if m.fingerprint != nil {
			fp, refused = m.customPrint(w, r, body)
		} else {
			fp = requestPrint(r, r.URL.EscapedPath(), body)
		}
	}
	if refused != "" {
		bodyBuffers.put(bp)
		ob.end(refused, nil)
		return
	}
	h.run(w, r, op{kind: KindHTTP, scope: scope, key: key, fp: fp, detach: true, wait: m.wait, retention: m.retention, obs: ob}, bp, body)
}

// funcKeyValid reports whether the key function's result is a valid key,
// or answers with a problem.
func (m *middleware) funcKeyValid(w http.ResponseWriter, key string, err error) bool {
	switch {
	case err != nil:
		writeProblem(w, &probKeyInvalid, "The idempotency key could not be taken from the request ("+strings.TrimPrefix(err.Error(), "idem: ")+"). Nothing was done.")
		return false
	case key == "":
		writeProblem(w, &probKeyMissing, "The request carries no idempotency key where this server takes it from. Nothing was done.")
		return false
	}
	if err := wire.ValidKey(key); err != nil {
		writeProblem(w, &probKeyInvalid, "The request's idempotency key is invalid ("+strings.TrimPrefix(err.Error(), "idem: ")+"); it must be 1 to 255 printable ASCII characters. Nothing was done.")
		return false
	}
	return true
}

// pass runs the handler unprotected, with the body the middleware read.
func (h *idemHandler) pass(w http.ResponseWriter, r *http.Request, bp *[]byte, body []byte) {
	br := &bodyReader{b: body[:len(body):len(body)]}
	r2 := new(http.Request)
	*r2 = *r
	r2.Body = br
	h.next.ServeHTTP(w, r2)
	if br.drained() {
		putBody(bp, body)
	}
}

// customPrint fingerprints a request by WithFingerprint's function: method,
// escaped path and the function's bytes; or answers with a problem and
// returns the outcome of the refusal.
func (m *middleware) customPrint(w http.ResponseWriter, r *http.Request, body []byte) (print128, Outcome) {
	b, err := m.fingerprint(r, body[:len(body):len(body)])
	if err != nil {
		writeProblem(w, &probFingerprintFailed, "The request could not be compared with others carrying its "+m.keyName+" ("+strings.TrimPrefix(err.Error(), "idem: ")+"). Nothing was done.")
		return print128{}, OutcomeInvalidKey
	}
	p := printers.get()
	p.h.Reset()
	p.head = append(p.head[:0], r.Method...)
	p.head = append(p.head, '\n')
	p.head = append(p.head, r.URL.EscapedPath()...)
	p.head = append(p.head, '\n', '\n', modeFunc)
	p.h.Write(p.head)
	p.h.Write(b)
	fp := print128(p.h.Sum(p.sum[:0])[:16])
	if cap(p.head) <= maxPooledBuffer {
		printers.put(p)
	}
	return fp, ""
}
