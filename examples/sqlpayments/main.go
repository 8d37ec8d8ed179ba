// Command sqlpayments is the payments API of examples/payments with its
// ledger in a SQL database: each payment is booked in one transaction with
// the operation's outcome (package idemsql), so a retry finds a committed
// payment even when Redis lost the operation's record.
//
//	go run ./examples/sqlpayments -demo         # play the scenarios, and the one where Redis forgets
//	go run ./examples/sqlpayments               # one replica on 127.0.0.1:8080
//	go run ./examples/sqlpayments -db postgres://user@host/db   # book payments in PostgreSQL
//
// Without -redis or REDIS_URL it runs an embedded Redis (miniredis); without
// -db or DATABASE_URL, a SQLite database in a temporary directory (pure Go:
// nothing to install, but the driver takes a while to compile the first
// time). POST /payments charges a fake payment provider and books the
// payment; GET /payments/{id} reads a payment. Authenticate with
// "Authorization: Bearer sk_test_alice".
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/idemkit/idem/examples/internal/paydemo"
	"github.com/idemkit/idem/idemclient"
)

func main() {
	var (
		addr     = flag.String("addr", "127.0.0.1:8080", "address of the first replica; the others take the next ports")
		replicas = flag.Int("replicas", 1, "number of replicas sharing one Redis")
		redisURL = flag.String("redis", "", "Redis address (host:port) or URL; default $REDIS_URL, else an embedded miniredis")
		lease    = flag.Duration("lease", 30*time.Second, "idempotency lease")
		dbURL    = flag.String("db", "", "database: a postgres:// URL or a SQLite file; default $DATABASE_URL, else a temporary SQLite database")
		demo     = flag.Bool("demo", false, "play the scenarios and exit")
	)
	flag.Parse()
	if *redisURL == "" {
		*redisURL = os.Getenv("REDIS_URL")
	}
	if *dbURL == "" {
		*dbURL = os.Getenv("DATABASE_URL")
	}
	opts, stopRedis, err := paydemo.RedisOptions(*redisURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sqlpayments:", err)
		os.Exit(2)
	}
	db, stopDB, err := openDatabase(context.Background(), *dbURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sqlpayments:", err)
		stopRedis()
		os.Exit(2)
	}
	stop := func() { stopDB(); stopRedis() }
	defer stop()
	if *demo {
		err = paydemo.Run(os.Stdout, opts, db, redisForgets)
	} else {
		err = paydemo.Serve(*addr, *replicas, opts, db, *lease)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sqlpayments:", err)
		stop()
		os.Exit(1)
	}
}

// redisForgets is the scenario only a ledger in the database survives: the
// answer is lost, and Redis loses the completed record too. The retry is
// new to Redis; the database answers.
func redisForgets(d *paydemo.Demo, n int) error {
	d.Printf("%d. Redis forgets. The server charges, books the payment and answers; the answer is\n", n)
	d.Printf("   lost, and Redis loses the operation's record. The retry is new to Redis (attempt 1\n")
	d.Printf("   again), but the payment and its outcome committed together in the database.\n")
	d.LoseNextAnswer()
	d.ForgetNextLostAnswer()
	r := d.Pay("pay", idemclient.NewKey(), 5100)
	d.Printf("   the app gets %s\n", r)
	if r.Status != http.StatusCreated || r.Replayed {
		return fmt.Errorf("when Redis forgets: want 201 answered from the database, got %s", r)
	}
	return d.Tally(5)
}
