// Package idemlambda makes AWS Lambda functions in Go idempotent: a handler
// runs once per key across retries, redeliveries and every instance of the
// function sharing one Redis, and every repeat gets the first result.
//
//	var g = idem.New(idem.NewRedisStore(redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})))
//
//	func main() {
//		lambda.Start(idemlambda.Handler(g, orderKey, charge)) // or SQS, Kinesis, DynamoDB
//	}
//
// Handler wraps a handler of any event type (a direct or asynchronous
// invocation, EventBridge, Step Functions): the key comes from the event,
// the event is fingerprinted, and the result is stored and replayed. SQS,
// Kinesis and DynamoDB process batches record by record and answer with
// BatchItemFailures: records that failed, have no key, or are still running
// elsewhere are delivered again, records already done are skipped. HTTP
// functions (API Gateway, function URLs) keep idem.Guard.Middleware behind
// github.com/awslabs/aws-lambda-go-api-proxy, with LeaseContext.
//
// # The lease ends with the invocation
//
// Lambda stops an instance at its function's timeout, and freezes it between
// invocations. A claim made under an invocation's context holds its lease
// until the invocation's deadline plus one second at most, heartbeats
// included (LeaseContext, idem.ContextWithLeaseEnd): the retry of an event
// whose instance timed out runs at once as the next attempt (Attempt.Fence
// one higher, the dead attempt's checkpoints), instead of waiting out the
// Guard's whole lease (idem.WithLease).
//
// # Keys
//
// Keys are scoped by the function's name (WithScope), so that two functions
// sharing one Redis keep apart. Handler takes the key from its key function
// (a client's request id, an order id); SQS records are keyed by MessageId,
// Kinesis and DynamoDB records by EventID, or by WithSQSKey, WithKinesisKey
// and WithDynamoDBKey. An event without a key is refused with ErrNoKey, never
// run unprotected.
//
// # Connections
//
// Make the Redis client and the Guard once per instance, outside the handler
// (in a package variable or main, before lambda.Start): they survive the
// freezes between invocations, and a cold start then pays for one
// connection, not one per invocation. The README of this module lists
// client timeouts for a function in a VPC next to ElastiCache or MemoryDB.
package idemlambda
