package paydemo

import "testing"

func TestServeReplica(t *testing.T) { CheckReplica(t, &MemoryLedger{}) }
