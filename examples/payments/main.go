// Command payments is a small payments API protected by idem.
//
//	go run ./examples/payments               # one replica on 127.0.0.1:8080
//	go run ./examples/payments -replicas 3   # three replicas sharing one Redis
//	go run ./examples/payments -demo         # play the design's scenarios
//
// Without -redis or REDIS_URL it runs an embedded Redis (miniredis): nothing
// to install. POST /payments charges a fake payment provider and books the
// payment in a ledger kept in memory; GET /payments/{id} reads a payment.
// Authenticate with "Authorization: Bearer sk_test_alice".
//
// examples/sqlpayments is the same API with its ledger in a SQL database,
// committed with the operation's outcome (package idemsql).
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/idemkit/idem/examples/internal/paydemo"
)

func main() {
	var (
		addr     = flag.String("addr", "127.0.0.1:8080", "address of the first replica; the others take the next ports")
		replicas = flag.Int("replicas", 1, "number of replicas sharing one Redis")
		redisURL = flag.String("redis", "", "Redis address (host:port) or URL; default $REDIS_URL, else an embedded miniredis")
		lease    = flag.Duration("lease", 30*time.Second, "idempotency lease")
		demo     = flag.Bool("demo", false, "play the scenarios and exit")
	)
	flag.Parse()
	if *redisURL == "" {
		*redisURL = os.Getenv("REDIS_URL")
	}
	opts, stop, err := paydemo.RedisOptions(*redisURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments:", err)
		os.Exit(2)
	}
	defer stop()
	ledger := &paydemo.MemoryLedger{}
	if *demo {
		err = paydemo.Run(os.Stdout, opts, ledger)
	} else {
		err = paydemo.Serve(*addr, *replicas, opts, ledger, *lease)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments:", err)
		stop()
		os.Exit(1)
	}
}
