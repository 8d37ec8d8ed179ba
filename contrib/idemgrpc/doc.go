// Package idemgrpc makes unary gRPC calls idempotent with idem: a server
// interceptor that runs each call carrying an idempotency key once, across
// every replica sharing one Redis, and answers its repeats with the first
// answer; and a client interceptor that sends a key and retries with it.
//
//	g := idem.New(idem.NewRedisStore(rdb), idem.WithWait(5*time.Second))
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(idemgrpc.UnaryServerInterceptor(g, idemgrpc.WithScope(tenantOf))))
//	conn, err := grpc.NewClient(addr, creds, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor()))
//
// A client whose deadline expired cannot know whether the server charged the
// card; gRPC's retry policy re-sends the call. With a key on the call
// (AIP-155's request_id, or the idempotency-key metadata), the repeat gets
// the first answer and the card is charged once.
//
// A runnable example, a payments service and its client on an embedded Redis
// (miniredis), charges a card once, replays a retried call, refuses a key
// reused for another amount, and retries a call whose answer was lost; from
// the repository's root:
//
//	go -C contrib/idemgrpc run ./examples/payments
//
// # Server contract
//
// A call's key is read by the WithKeyFunc function, when it reports one, else
// from the idempotency-key metadata (a value in double quotes is an RFC 8941
// string and is unquoted first, as idem's HTTP middleware does). The call is
// one operation per (scope, full method, key), and "the same request" is the
// full method plus the deterministic protobuf encoding of the request
// message (unknown fields included).
//
//	situation                                   answer
//	------------------------------------------  ----------------------------------------------------------
//	no key, method not in WithRequiredKey       passed through; Redis untouched
//	no key, method in WithRequiredKey           InvalidArgument (ReasonKeyMissing); handler not run
//	key invalid (empty, > 255 bytes, not        InvalidArgument (ReasonKeyInvalid); handler not run
//	  printable ASCII, metadata sent twice)
//	WithScope returned ""                       Internal (ReasonScopeMissing); handler not run
//	first call                                  handler runs once, with idem.AttemptFrom(ctx); its answer
//	                                            is stored (see below) and then returned
//	repeat, completed                           the stored response, same concrete type and value, or the
//	                                            stored status (code, message, details); header metadata
//	                                            idempotent-replayed: true; handler not run
//	repeat while the first runs                 with the Guard's WithWait, the first answer once stored;
//	                                            without, or when the wait runs out, Aborted
//	                                            (ReasonInProgress) with errdetails.RetryInfo (WithRetryDelay,
//	                                            default 1s, capped by the first call's lease)
//	same key, other request                     InvalidArgument (ReasonKeyReused); handler not run
//	same key, other method                      another operation: the handler runs (keys are per method)
//	Redis unreachable                           Unavailable (ReasonStoreUnavailable); handler not run
//	handler panics                              key released, panic continues (put a recovery
//	                                            interceptor outside this one)
//	handler ran, record not written             the handler's own answer, not marked; the Guard logs it
//	streaming call                              not intercepted: unary interceptors never see streams
//
// idem's own errors carry an errdetails.ErrorInfo with domain ErrorDomain and
// one of the Reason constants.
//
// What is stored: a response (nil error) as its type URL and deterministic
// encoding (a google.protobuf.Any), replayed as a new message of the same
// type (the type must be linked into the server, as generated types are); an
// error whose status code is InvalidArgument, NotFound, AlreadyExists,
// PermissionDenied, FailedPrecondition, OutOfRange or Unimplemented, or any
// error wrapped by idem.Permanent, as a google.rpc.Status (code, message,
// details). Every other error (Unavailable, DeadlineExceeded, Aborted,
// ResourceExhausted, Internal, Unknown, Canceled, Unauthenticated, a plain Go
// error) releases the key: the next call with it runs the handler again, with
// Attempt.Fence one higher.
//
// The handler's context is the call's, with the Attempt: it ends with the
// call's deadline, as usual in gRPC, and also when the lease is lost (cause
// idem.ErrLeaseLost). A handler that finishes after its caller gave up still
// has its answer stored, for the retry.
//
// The key given to idem.Do is "rpc:<len>:<scope>:<len>:<full method>:<key>",
// or "rpc#" and its SHA-256 when that is longer than 255 bytes or not
// printable ASCII; Attempt.Key is that key, and Attempt.ID, stable across
// attempts, is the id to give to external providers. The encoding is the
// same in idemconnect, so a service served through both shares its records.
// Events the caller cannot see in the answer (an empty scope, a stored answer
// that does not decode) are logged with slog.Default.
//
// # Client contract
//
// UnaryClientInterceptor attaches the key (the call's own metadata, else
// idemclient.WithKey's, else a new idemclient.NewKey per call) and retries Unavailable,
// and Aborted with errdetails.RetryInfo, with the same key, honouring the
// RetryInfo delay, with capped exponential backoff and full jitter, within
// the call's deadline. It composes with gRPC's retry policy: the key is in
// the metadata that gRPC re-sends.
package idemgrpc
