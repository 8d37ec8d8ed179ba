package idemgin_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemgin"
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
	r := gin.New()
	r.POST("/orders/:id/pay", idemgin.Middleware(g), func(c *gin.Context) {
		a, _ := idem.AttemptFrom(c.Request.Context()) // a.ID: the payment provider's idempotency key
		charges++
		c.Header("Location", "/payments/"+c.Param("id"))
		c.JSON(http.StatusCreated, gin.H{"order": c.Param("id"), "fence": a.Fence})
	})

	for _, body := range []string{`{"amount":1000}`, `{ "amount": 1000 }`, `{"amount":5000}`} {
		req := httptest.NewRequest(http.MethodPost, "/orders/42/pay", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Printf("%d replayed=%q %s\n", w.Code, w.Header().Get("Idempotent-Replayed"), w.Header().Get("Content-Type"))
		if w.Code == http.StatusCreated {
			fmt.Println(" ", w.Header().Get("Location"), w.Body.String())
		}
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201 replayed="" application/json; charset=utf-8
	//   /payments/42 {"fence":1,"order":"42"}
	// 201 replayed="true" application/json; charset=utf-8
	//   /payments/42 {"fence":1,"order":"42"}
	// 422 replayed="" application/problem+json
	// charges: 1
}
