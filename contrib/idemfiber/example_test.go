package idemfiber_test

import (
	"fmt"
	"io"
	"net/http/httptest"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/gofiber/fiber/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemfiber"
)

func ExampleNew() {
	mr := miniredis.NewMiniRedis() // an embedded Redis for the example; use yours in production
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := idem.New(idem.NewRedisStore(rdb))

	charges := 0
	app := fiber.New()
	app.Post("/orders/:id/pay", idemfiber.New(g), func(c *fiber.Ctx) error {
		a, _ := idem.AttemptFrom(c.UserContext()) // a.ID: the payment provider's idempotency key
		charges++
		c.Location("/payments/" + c.Params("id"))
		return c.Status(fiber.StatusCreated).JSON(fiber.Map{"order": c.Params("id"), "fence": a.Fence})
	})

	for _, body := range []string{`{"amount":1000}`, `{ "amount": 1000 }`, `{"amount":5000}`} {
		req := httptest.NewRequest(fiber.MethodPost, "/orders/42/pay", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		resp, err := app.Test(req, -1)
		if err != nil {
			panic(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), resp.Header.Get("Content-Type"))
		if resp.StatusCode == fiber.StatusCreated {
			fmt.Println(" ", resp.Header.Get("Location"), string(b))
		}
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201 replayed="" application/json
	//   /payments/42 {"fence":1,"order":"42"}
	// 201 replayed="true" application/json
	//   /payments/42 {"fence":1,"order":"42"}
	// 422 replayed="" application/problem+json
	// charges: 1
}
