package paydemo_test

import (
	"testing"

	"github.com/idemkit/idem/examples/internal/paydemo"
)

func TestServeReplica(t *testing.T) { paydemo.CheckReplica(t, &paydemo.MemoryLedger{}) }
