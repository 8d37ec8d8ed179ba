package idemsql_test

import (
	"context"
	"database/sql"
	"strconv"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idemsql"
)

// BenchmarkTx measures what idemsql adds to the effect's transaction, Redis
// excluded: the same payment row in a plain transaction (the baseline) and
// in idemsql.Tx, one fresh operation per iteration, on each database.
func BenchmarkTx(b *testing.B) {
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			d := be.open(b)
			ctx := context.Background()
			receipt := "receipt"
			b.Run("plain transaction", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					tx, err := d.db.BeginTx(ctx, nil)
					if err == nil {
						_, err = tx.ExecContext(ctx, `INSERT INTO payments (op, receipt) VALUES ($1, $2)`, "plain", receipt)
					}
					if err == nil {
						err = tx.Commit()
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("idemsql.Tx", func(b *testing.B) {
				b.ReportAllocs()
				a := &idem.Attempt{Key: "bench", Fence: 1}
				prefix, n := idemclient.NewKey(), 0
				for b.Loop() {
					n++
					a.ID = prefix + strconv.Itoa(n)
					_, err := idemsql.Tx(ctx, d.db, a, func(ctx context.Context, tx *sql.Tx) (string, error) {
						_, err := tx.ExecContext(ctx, `INSERT INTO payments (op, receipt) VALUES ($1, $2)`, "tx", receipt)
						return receipt, err
					})
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
