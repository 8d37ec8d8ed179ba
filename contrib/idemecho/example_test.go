package idemecho_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemecho"
)

func ExampleMiddleware() {
	mr := miniredis.NewMiniRedis() // an embedded Redis for the example; use yours in production
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := idem.New(idem.NewRedisStore(rdb))

	charges := 0
	e := echo.New()
	e.POST("/orders/:id/pay", func(c echo.Context) error {
		a, _ := idem.AttemptFrom(c.Request().Context()) // a.ID: the payment provider's idempotency key
		charges++
		if charges == 1 {
			return echo.NewHTTPError(http.StatusBadGateway, "provider unreachable") // 5xx: released, retried
		}
		c.Response().Header().Set("Location", "/payments/"+c.Param("id"))
		return c.JSON(http.StatusCreated, map[string]any{"order": c.Param("id"), "fence": a.Fence})
	}, idemecho.Middleware(g))

	for range 3 {
		req := httptest.NewRequest(http.MethodPost, "/orders/42/pay", strings.NewReader(`{"amount":1000}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		w := httptest.NewRecorder()
		e.ServeHTTP(w, req)
		fmt.Printf("%d replayed=%q location=%q %s", w.Code, w.Header().Get("Idempotent-Replayed"), w.Header().Get("Location"), w.Body)
	}
	fmt.Println("charges:", charges)
	// Output:
	// 502 replayed="" location="" {"message":"provider unreachable"}
	// 201 replayed="" location="/payments/42" {"fence":2,"order":"42"}
	// 201 replayed="true" location="/payments/42" {"fence":2,"order":"42"}
	// charges: 2
}
