package idem

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// The package's tests run many operations at once on miniredis and on a
// loaded machine (the race detector, two test runs side by side in CI),
// where a store call can wait seconds for a pooled connection: a Guard
// without WithStoreTimeout gets 10s here, so that only the tests about the
// store timeout, which set it (TestFreezeUnderLoad: the default, 1s), see
// it refuse. TestGuardOptionBounds checks the default users get.
func init() { storeTimeoutDefault = 10 * time.Second }

// AnswerHook is answerHook, for the package's external tests: a go-redis
// hook that answers every command with reply, without a server.
func AnswerHook(reply any) redis.Hook { return answerHook{reply} }
