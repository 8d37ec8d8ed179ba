// Package idemconnect makes unary Connect calls idempotent with idem: a
// handler interceptor that runs each call carrying an idempotency key once,
// across every replica sharing one Redis, and answers its repeats with the
// first answer; and a client interceptor that sends a key and retries with
// it. It is idemgrpc's contract for connectrpc.com/connect, over the
// Connect, gRPC and gRPC-Web protocols alike.
//
//	g := idem.New(idem.NewRedisStore(rdb), idem.WithWait(5*time.Second))
//	mux.Handle(paymentsv1connect.NewPaymentsHandler(svc, connect.WithInterceptors(idemconnect.NewServerInterceptor(g, idemconnect.WithScope(tenantOf)))))
//	client := paymentsv1connect.NewPaymentsClient(http.DefaultClient, url, connect.WithInterceptors(idemconnect.NewClientInterceptor()))
//
// # Server contract
//
// A call's key is read by the WithKeyFunc function, when it reports one, else
// from the Idempotency-Key header (a value in double quotes is an RFC 8941
// string and is unquoted first, as idem's HTTP middleware does). The call is
// one operation per (scope, procedure, key), and "the same request" is the
// procedure plus the deterministic protobuf encoding of the request message
// (unknown fields included).
//
//	situation                                   answer
//	------------------------------------------  ----------------------------------------------------------
//	no key, procedure not in WithRequiredKey    passed through; Redis untouched
//	no key, procedure in WithRequiredKey        invalid_argument (ReasonKeyMissing); handler not run
//	key invalid (empty, > 255 bytes, not        invalid_argument (ReasonKeyInvalid); handler not run
//	  printable ASCII, header sent twice)
//	WithScope returned ""                       internal (ReasonScopeMissing); handler not run
//	first call                                  handler runs once, with idem.AttemptFrom(ctx); its answer
//	                                            is stored (see below) and then returned
//	repeat, completed                           the stored response message, same type and value, or the
//	                                            stored error (code, message, details); response header
//	                                            Idempotent-Replayed: true; handler not run
//	repeat while the first runs                 with the Guard's WithWait, the first answer once stored;
//	                                            without, or when the wait runs out, aborted
//	                                            (ReasonInProgress) with errdetails.RetryInfo (WithRetryDelay,
//	                                            default 1s, capped by the first call's lease)
//	same key, other request                     invalid_argument (ReasonKeyReused); handler not run
//	same key, other procedure                   another operation: the handler runs (keys are per procedure)
//	Redis unreachable                           unavailable (ReasonStoreUnavailable); handler not run
//	handler panics                              key released, panic continues (connect.WithRecover, outside
//	                                            the interceptors, turns it into an error)
//	handler ran, record not written             the handler's own answer, not marked; the Guard logs it
//	streaming call                              passed through untouched
//
// idem's own errors carry an errdetails.ErrorInfo with domain ErrorDomain and
// one of the Reason constants.
//
// What is stored: a response message (nil error) as its type URL and
// deterministic encoding (a google.protobuf.Any), replayed as a new message
// of the same type (the type must be linked into the server, as generated
// types are); an error whose code is invalid_argument, not_found,
// already_exists, permission_denied, failed_precondition, out_of_range or
// unimplemented, or any error wrapped by idem.Permanent, as a google.rpc.Status
// (code, message, details). Every other error (unavailable,
// deadline_exceeded, aborted, resource_exhausted, internal, unknown,
// canceled, unauthenticated, a plain Go error) releases the key: the next
// call with it runs the handler again, with Attempt.Fence one higher. The
// headers and trailers a handler sets, and an error's metadata, are not
// stored.
//
// A replayed response is not the *connect.Response[T] the handler would
// have made: Connect builds typed responses only in generated code, so the
// replay's Any() is a proto.Message that wraps the stored message and
// encodes exactly as it does. Clients decode the same bytes; an interceptor
// outside this one that type-asserts Any() to a generated type sees the
// wrapper instead, and should go through proto.Message (ProtoReflect).
//
// The handler's context is the call's, with the Attempt: it ends with the
// call's deadline and also when the lease is lost (cause idem.ErrLeaseLost).
// A handler that finishes after its caller gave up still has its answer
// stored, for the retry.
//
// The key given to idem.Do is "rpc:<len>:<scope>:<len>:<procedure>:<key>",
// or "rpc#" and its SHA-256 when that is longer than 255 bytes or not
// printable ASCII; Attempt.Key is that key, and Attempt.ID, stable across
// attempts, is the id to give to external providers. The encoding and the
// stored answers are those of idemgrpc, so a service served through both
// shares its records. Events the caller cannot see in the answer (an empty
// scope, a stored answer that does not decode) are logged with slog.Default.
//
// # Client contract
//
// NewClientInterceptor attaches the key (the call's own header, else
// idemclient.WithKey's, else a new idemclient.NewKey per call) and retries unavailable,
// and aborted with errdetails.RetryInfo, with the same key, honouring the
// RetryInfo delay, with capped exponential backoff and full jitter, within
// the call's deadline.
package idemconnect
