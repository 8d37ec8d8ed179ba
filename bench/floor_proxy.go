package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// floorProxyEnv, set to "LISTEN UPSTREAM REDIS-ADDR PREFIX", makes this
// binary the floor of scenario 14: an httputil.ReverseProxy that claims a
// keyed request with SET NX PX before sending it and stores the answer with
// SET PX after, run as a process of its own as idem proxy is. It is the
// least a proxy that runs each key once can do: no fingerprint, no owner,
// no fence, no renewal, no replay of headers, no log.
const floorProxyEnv = "IDEM_BENCH_FLOOR_PROXY"

// floorKey carries a request's Redis key from the handler to
// ModifyResponse.
type floorKey struct{}

// serveFloorProxy serves the floor proxy until killed.
func serveFloorProxy(spec string) int {
	f := strings.Fields(spec)
	if len(f) != 4 {
		fmt.Fprintln(os.Stderr, floorProxyEnv+": want LISTEN UPSTREAM REDIS-ADDR PREFIX")
		return 2
	}
	rp, err := reverseProxy(f[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	rdb := redis.NewClient(&redis.Options{Addr: f[2]})
	prefix := f[3] + ":"
	rp.ModifyResponse = func(resp *http.Response) error {
		key, ok := resp.Request.Context().Value(floorKey{}).(string)
		if !ok {
			return nil
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		rec := strconv.Itoa(resp.StatusCode) + " " + string(body)
		return rdb.Set(resp.Request.Context(), key, rec, 10*time.Minute).Err()
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := r.Header.Get("Idempotency-Key")
		if k == "" {
			rp.ServeHTTP(w, r)
			return
		}
		key := prefix + r.Header.Get("X-Account") + "/" + k
		ok, err := rdb.SetNX(r.Context(), key, "", 30*time.Second).Result()
		switch {
		case err != nil:
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		case ok:
			rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), floorKey{}, key)))
		default:
			floorReplay(w, r, rdb, key)
		}
	})
	return serveUntilKilled(f[0], h)
}

// floorReplay answers a key the floor proxy has seen: the stored answer,
// or 409 while its first request runs.
func floorReplay(w http.ResponseWriter, r *http.Request, rdb *redis.Client, key string) {
	rec, err := rdb.Get(r.Context(), key).Result()
	if err != nil && err != redis.Nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	status, body, ok := strings.Cut(rec, " ")
	code, cerr := strconv.Atoi(status)
	if !ok || cerr != nil {
		http.Error(w, "in progress", http.StatusConflict)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, body)
}
