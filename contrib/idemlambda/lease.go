package idemlambda

import (
	"context"
	"time"

	"github.com/idemkit/idem"
)

// leaseMargin is how long past an invocation's deadline a claim made during
// the invocation may hold its lease: the time Lambda takes to stop an
// instance at its timeout, with room for the clocks of the instance and of
// Redis to differ.
const leaseMargin = time.Second

// LeaseContext returns a copy of ctx under which a claim holds its lease no
// later than ctx's deadline (the invocation's, in a Lambda handler) plus one
// second, heartbeats included (idem.ContextWithLeaseEnd): an instance killed
// at its timeout, or frozen after it, blocks a retry of its key until a
// second past the deadline, not for the Guard's whole lease. Without a
// deadline it returns ctx.
//
// Handler, SQS, Kinesis and DynamoDB apply it to every invocation. Apply it
// yourself where a claim is made under another adapter, such as
// g.Middleware behind aws-lambda-go-api-proxy:
//
//	adapter := httpadapter.NewV2(g.Middleware()(mux))
//	lambda.Start(func(ctx context.Context, e events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
//		return adapter.ProxyWithContext(idemlambda.LeaseContext(ctx), e)
//	})
//
// A function still running a second past the deadline (its context done
// since the deadline) loses its lease: its result is not stored, and a
// retry may run as the next attempt. Lambda stops it at the deadline anyway.
func LeaseContext(ctx context.Context) context.Context {
	deadline, ok := ctx.Deadline()
	if !ok {
		return ctx
	}
	return idem.ContextWithLeaseEnd(ctx, deadline.Add(leaseMargin))
}
