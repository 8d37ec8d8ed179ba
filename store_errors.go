package idem

import (
	"context"
	"errors"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"
)

// classify tells how a store call that failed with err ended, for
// fail-fast: the store answered (a refusal such as ErrLeaseLost, a script's
// error), did not answer (a timeout, a refused or broken connection, a
// server that is loading or has lost its master), or neither (the call was
// refused before it went out).
func classify(err error) callEnd {
	var fe *failingError
	var rerr redis.Error
	var ue *unackedError
	switch {
	case errors.As(err, &fe):
		return callDropped
	case errors.Is(err, ErrLeaseLost), errors.Is(err, ErrUnreadable), errors.As(err, &ue):
		return callAnswered
	case errors.Is(err, errWriteTimeout), errors.Is(err, context.DeadlineExceeded):
		return callFailed
	case errors.As(err, &rerr):
		for _, p := range outagePrefixes {
			if strings.HasPrefix(rerr.Error(), p) {
				return callFailed
			}
		}
		return callAnswered
	case errors.Is(err, ErrStoreUnavailable):
		// A store that cannot work at all (a nil client, a Ring, a sealer's
		// bad key) or too few replicas: it is not down, it is refused.
		return callDropped
	}
	return callFailed
}

// outagePrefixes are the error replies of a server that cannot serve now,
// though it answers: loading its data, cut off from its master or cluster,
// or busy with a script.
var outagePrefixes = []string{"LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "BUSY ", "READONLY"}

// mayHaveRun reports whether a store call that failed with err may still
// have run, or still run, on the server: it was (or may have been) sent,
// and its reply never came. A call refused by fail-fast, a connection that
// could not be made, a server's error reply and a store that cannot work
// did not run.
func mayHaveRun(err error) bool {
	var fe *failingError
	var rerr redis.Error
	var op *net.OpError
	var ue *unackedError
	switch {
	case err == nil:
		return false
	case errors.As(err, &fe), errors.As(err, &rerr):
		return false
	case errors.As(err, &ue): // the store released it already
		return false
	case errors.As(err, &op) && op.Op == "dial":
		return false
	case errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrClosed):
		return false
	case errors.Is(err, ErrStoreUnavailable) && !errors.Is(err, errWriteTimeout):
		return false
	}
	return true
}
