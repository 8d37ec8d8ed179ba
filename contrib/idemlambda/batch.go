package idemlambda

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idem"
)

// A source describes the records of one event source for runBatch.
type source[R any] struct {
	name  string                    // SQS, Kinesis, DynamoDB: in logs
	ident func(r R) string          // the record's ItemIdentifier
	key   func(r R) (string, error) // the record's key, before its scope
	fp    func(r R) (any, error)    // what is compared of a record
	// group returns the group whose order a failed record holds back (a
	// FIFO queue's message group), and whether there is one. Nil: the
	// records are independent, and all of them run.
	group func(r R) (string, bool)
	// stopAtFailure: the records are one ordered shard; the first failure
	// is reported alone and the records after it do not run (the event
	// source retries from it).
	stopAtFailure bool
}

// runBatch runs h once per record of records under g and returns the
// identifiers of the records to report in BatchItemFailures.
func runBatch[R any](ctx context.Context, g *idem.Guard, c *config, s source[R], records []R, h func(context.Context, R) error) []string {
	ctx = LeaseContext(ctx)
	failed := []string{}
	var held map[string]bool // groups held back by a failed record
	for _, r := range records {
		id := s.ident(r)
		if s.group != nil {
			if grp, ok := s.group(r); ok && held[grp] {
				failed = append(failed, id)
				c.logger.WarnContext(ctx, "idemlambda: record not run: an earlier record of its group failed",
					"source", s.name, "item", id, "group", grp)
				continue
			}
		}
		err := runRecord(ctx, g, c, s, r, h)
		if err == nil {
			continue
		}
		failed = append(failed, id)
		c.logger.WarnContext(ctx, "idemlambda: record failed", "source", s.name, "item", id, "error", err)
		if s.stopAtFailure {
			return failed
		}
		if s.group != nil {
			if grp, ok := s.group(r); ok {
				if held == nil {
					held = map[string]bool{}
				}
				held[grp] = true
			}
		}
	}
	return failed
}

// runRecord runs h for r once per key, and returns nil when r is done: run
// now, or done before.
func runRecord[R any](ctx context.Context, g *idem.Guard, c *config, s source[R], r R, h func(context.Context, R) error) error {
	k, err := s.key(r)
	switch {
	case err != nil:
		return fmt.Errorf("%w: %w", ErrNoKey, err)
	case k == "":
		return fmt.Errorf("%w: the key function returned none", ErrNoKey)
	}
	req, err := s.fp(r)
	if err != nil {
		return err
	}
	var herr error
	ran := false
	_, err = idem.Do(ctx, g, c.key(k), req, func(ctx context.Context, a *idem.Attempt) (struct{}, error) {
		ran = true
		herr = h(idem.ContextWithAttempt(ctx, a), r)
		return struct{}{}, herr
	})
	if ran && herr == nil && errors.Is(err, idem.ErrNotRecorded) {
		return nil // h succeeded; logged by the Guard
	}
	return err
}
