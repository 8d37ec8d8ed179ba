package idem_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// Results are sealed before they reach Redis. In production the keys come
// from a secret manager, the same list on every replica; rotate as
// NewAESGCMSealer says.
func ExampleWithSealer() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	k1 := make([]byte, 32)
	rand.Read(k1)
	sealer, err := idem.NewAESGCMSealer("k1", map[string][]byte{"k1": k1})
	if err != nil {
		panic(err)
	}
	g := idem.New(idem.NewRedisStore(rdb), idem.WithSealer(sealer))

	charge := func(ctx context.Context, a *idem.Attempt) (string, error) { return "ch_4242", nil }
	for range 2 {
		receipt, err := idem.Do(context.Background(), g, "order-42", "pay 10 EUR", charge)
		fmt.Println(receipt, err)
	}
	stored, _ := rdb.Get(context.Background(), "idem:{"+idem.OperationID(idem.KindDo, "", "order-42")+"}").Result()
	fmt.Println("ch_4242 readable in Redis:", strings.Contains(stored, "ch_4242"))
	// Output:
	// ch_4242 <nil>
	// ch_4242 <nil>
	// ch_4242 readable in Redis: false
}
