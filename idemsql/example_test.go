package idemsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idemsql"
)

// The payment row and the operation's outcome commit in one transaction.
// When Redis loses the record after the commit, the retry is answered from
// the database and the payment is not made twice.
func ExampleTx() {
	ctx := context.Background()
	mr, _ := miniredis.Run() // an embedded Redis for the example; use yours in production
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := idem.New(idem.NewRedisStore(rdb))

	dir, _ := os.MkdirTemp("", "idemsql-example-")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", "file:"+filepath.Join(dir, "shop.db")+"?_pragma=busy_timeout(5000)")
	defer db.Close()
	if err := idemsql.CreateTable(ctx, db); err != nil {
		fmt.Println(err)
		return
	}
	_, _ = db.ExecContext(ctx, `CREATE TABLE payments (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)`)

	type Payment struct {
		ID     int64 `json:"id"`
		Amount int64 `json:"amount"`
	}
	pay := func(ctx context.Context, a *idem.Attempt) (Payment, error) {
		return idemsql.Tx(ctx, db, a, func(ctx context.Context, tx *sql.Tx) (Payment, error) {
			p := Payment{Amount: 1000}
			err := tx.QueryRowContext(ctx, `INSERT INTO payments (amount) VALUES ($1) RETURNING id`, p.Amount).Scan(&p.ID)
			return p, err
		})
	}

	key := idemclient.NewKey() // made by the client, reused on every retry
	p, err := idem.Do(ctx, g, key, "pay 1000", pay)
	fmt.Println(p, err)
	mr.FlushAll() // Redis forgets (a failover before replication)
	p, err = idem.Do(ctx, g, key, "pay 1000", pay)
	fmt.Println(p, err)

	var n int
	_ = db.QueryRowContext(ctx, `SELECT count(*) FROM payments`).Scan(&n)
	fmt.Println("payments:", n)
	// Output:
	// {1 1000} <nil>
	// {1 1000} <nil>
	// payments: 1
}
