package idem_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemclient"
)

// TestMiddlewareEmptyScopeFailsClosed: a scope function that returns ""
// (authentication did not run, an anonymous caller) must not fall back to
// the scope everyone shares, where another tenant's response waits.
func TestMiddlewareEmptyScopeFailsClosed(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		log, logged := recordingLogger()
		app := newTestApp()
		tenant := idem.WithScope(func(r *http.Request) string { return r.Header.Get("X-Tenant") })
		h := idem.New(idem.NewRedisStore(b.client, idem.WithPrefix(b.prefix)), idem.WithLogger(log)).Middleware(tenant)(app)
		noScope := idem.New(idem.NewRedisStore(b.client, idem.WithPrefix(b.prefix)), quiet).Middleware()(app)

		// A tenant's request and one without a scope, both stored.
		require.Equal(t, http.StatusCreated, serve(h, req{key: "k", header: http.Header{"X-Tenant": {"a"}}}).Code)
		require.Equal(t, http.StatusCreated, serve(noScope, req{key: "k"}).Code)
		keys := storeKeys(t, b.client, b.prefix)

		rec := serve(h, req{key: "k"})
		p := requireProblem(t, rec, http.StatusInternalServerError, "scope-missing")
		require.Contains(t, p.Detail, "not processed")
		require.Equal(t, "no-store", rec.Header().Get("Cache-Control"))
		require.EqualValues(t, 2, app.runs.Load(), "the handler did not run")
		require.Equal(t, keys, storeKeys(t, b.client, b.prefix), "the store was not touched")
		require.Contains(t, logged(), "level=ERROR")
		require.Contains(t, logged(), "empty scope")

		// Without a key, WithOptionalKey passes the request through first.
		opt := idem.New(idem.NewRedisStore(b.client, idem.WithPrefix(b.prefix)), quiet).Middleware(tenant, idem.WithOptionalKey())(app)
		require.Equal(t, http.StatusCreated, serve(opt, req{}).Code)
		requireProblem(t, serve(opt, req{key: "k"}), http.StatusInternalServerError, "scope-missing")
	})
}

func TestMiddlewareWithMethodsNormalised(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		app := newTestApp()
		h := b.guard(t).Middleware(idem.WithMethods("post", "Put", "x-custom"))(app)
		for _, method := range []string{"POST", "PUT", "X-CUSTOM", "post"} {
			requireProblem(t, serve(h, req{method: method}), http.StatusBadRequest, "key-missing")
		}
		for _, method := range []string{"PATCH", "GET", "DELETE"} {
			require.Equal(t, http.StatusCreated, serve(h, req{method: method}).Code, method)
		}
		require.EqualValues(t, 3, app.runs.Load())
	})
	g := idem.New(nil)
	for _, bad := range []string{"get", "Head", "options", "trace", "", "PO ST", "POST\n", "P\u00d6ST", "(POST)", "POST/1", "a:b", "\"POST\""} {
		require.Panics(t, func() { g.Middleware(idem.WithMethods(bad)) }, "%q", bad)
	}
	require.NotPanics(t, func() { g.Middleware(idem.WithMethods("M-SEARCH", "PROPFIND", "a.b~c!#$%&'*+^_`|")) })
}

// TestMiddlewareRetryAfterIsAPollHint: under the defaults (no wait, a 30 s
// lease) a double click's duplicate is told to come back in a second, not
// when the lease would run out.
func TestMiddlewareRetryAfterIsAPollHint(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		for _, tc := range []struct {
			name     string
			lease    time.Duration
			opts     []idem.HTTPOption
			min, max int
		}{
			{name: "default: 1 s", lease: 0, min: 1, max: 1},
			{name: "WithRetryAfter", lease: 0, opts: []idem.HTTPOption{idem.WithRetryAfter(5 * time.Second)}, min: 5, max: 5},
			{name: "capped by the remaining lease", lease: 2 * time.Second, opts: []idem.HTTPOption{idem.WithRetryAfter(time.Minute)}, min: 1, max: 2},
			{name: "at least 1 s", lease: 0, opts: []idem.HTTPOption{idem.WithRetryAfter(time.Millisecond)}, min: 1, max: 1},
		} {
			t.Run(tc.name, func(t *testing.T) {
				app := newTestApp()
				var gopts []idem.Option
				if tc.lease > 0 {
					gopts = append(gopts, idem.WithLease(tc.lease))
				}
				h := b.guard(t, gopts...).Middleware(tc.opts...)(app)
				key := idemclient.NewKey()
				done := make(chan *httptest.ResponseRecorder)
				go func() { done <- serve(h, req{key: key, path: "/hold"}) }()
				<-app.started
				rec := serve(h, req{key: key, path: "/hold"})
				requireProblem(t, rec, http.StatusConflict, "in-progress")
				secs, err := strconv.Atoi(rec.Header().Get("Retry-After"))
				require.NoError(t, err)
				require.True(t, secs >= tc.min && secs <= tc.max, "Retry-After %d, want %d to %d", secs, tc.min, tc.max)
				close(app.release)
				require.Equal(t, http.StatusCreated, (<-done).Code)
			})
		}
	})
	g := idem.New(nil)
	for _, bad := range []idem.HTTPOption{idem.WithRetryAfter(0), idem.WithRetryAfter(-time.Second), idem.WithRouteWait(-time.Second)} {
		require.Panics(t, func() { g.Middleware(bad) })
	}
}

// TestMiddlewareRouteWait: one Guard serves routes with different waits.
func TestMiddlewareRouteWait(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		for _, tc := range []struct {
			name  string
			guard []idem.Option
			route []idem.HTTPOption
			waits bool
		}{
			{name: "route waits, Guard does not", route: []idem.HTTPOption{idem.WithRouteWait(20 * time.Second)}, waits: true},
			{name: "Guard waits, route does not", guard: []idem.Option{idem.WithWait(20 * time.Second)}, route: []idem.HTTPOption{idem.WithRouteWait(0)}},
			{name: "Guard's wait by default", guard: []idem.Option{idem.WithWait(20 * time.Second)}, waits: true},
			{name: "no wait by default"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				app := newTestApp()
				store := &busyStore{Store: b.store(), busy: make(chan struct{}, 1)}
				h := idem.New(store, append([]idem.Option{quiet}, tc.guard...)...).Middleware(tc.route...)(app)
				key := idemclient.NewKey()
				first := make(chan *httptest.ResponseRecorder)
				go func() { first <- serve(h, req{key: key, path: "/hold"}) }()
				<-app.started
				second := make(chan *httptest.ResponseRecorder)
				go func() { second <- serve(h, req{key: key, path: "/hold"}) }()
				<-store.busy
				if !tc.waits {
					requireProblem(t, <-second, http.StatusConflict, "in-progress")
					close(app.release)
					require.Equal(t, http.StatusCreated, (<-first).Code)
					return
				}
				close(app.release)
				a, r := <-first, <-second
				require.Equal(t, http.StatusCreated, a.Code)
				require.Equal(t, http.StatusCreated, r.Code)
				require.Equal(t, "true", r.Header().Get(idem.ReplayedHeader))
				require.Equal(t, a.Body.String(), r.Body.String())
				require.EqualValues(t, 1, app.runs.Load())
			})
		}
	})
}

// TestMiddlewareWaiterLeavingIsNotAnError: with waits common (WithRouteWait),
// a duplicate whose client leaves while it waits is not logged as an error.
func TestMiddlewareWaiterLeavingIsNotAnError(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		log, logged := recordingLogger()
		app := newTestApp()
		store := &busyStore{Store: b.store(), busy: make(chan struct{}, 1)}
		h := idem.New(store, idem.WithLogger(log)).Middleware(idem.WithRouteWait(time.Minute))(app)
		first := make(chan *httptest.ResponseRecorder)
		go func() { first <- serve(h, req{key: "k", path: "/hold"}) }()
		<-app.started
		ctx, leave := context.WithCancel(context.Background())
		second := make(chan struct{})
		go func() {
			defer close(second)
			h.ServeHTTP(httptest.NewRecorder(), req{key: "k", path: "/hold"}.build().WithContext(ctx))
		}()
		<-store.busy
		leave()
		<-second
		close(app.release)
		require.Equal(t, http.StatusCreated, (<-first).Code)
		require.NotContains(t, logged(), "level=ERROR")
	})
}

// TestRouteRetention: WithRouteRetention bounds the TTL of a route's keys
// by the route's retention (plus the lease while the handler runs).
func TestRouteRetention(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		const lease, retention, route = 2 * time.Second, 24 * time.Hour, time.Hour
		g := b.guard(t, idem.WithLease(lease), idem.WithRetention(retention))
		release := make(chan struct{})
		started := make(chan struct{}, 1)
		slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			started <- struct{}{}
			<-release
			w.WriteHeader(http.StatusCreated)
		})
		short := g.Middleware(idem.WithRouteRetention(route))(slow)
		long := g.Middleware()(slow)
		// ttls returns the PTTL of the record and of the lease (-2ns: none).
		ttls := func(key string) (record, lease time.Duration) {
			rk, lk := b.store().Keys(idem.OperationID(idem.KindHTTP, "", key))
			record, err := b.client.PTTL(context.Background(), rk).Result()
			require.NoError(t, err)
			lease, err = b.client.PTTL(context.Background(), lk).Result()
			require.NoError(t, err)
			return record, lease
		}
		for _, c := range []struct {
			key      string
			h        http.Handler
			min, max time.Duration // of the record's TTL
		}{{"short", short, route - time.Minute, route + lease}, {"long", long, retention - time.Minute, retention + lease}} {
			done := make(chan int, 1)
			go func() { done <- serve(c.h, req{key: c.key, body: "{}"}).Code }()
			<-started
			record, leaseTTL := ttls(c.key)
			require.Greater(t, record, c.min, "%s, running", c.key)
			require.LessOrEqual(t, record, c.max, "%s, running", c.key)
			require.Greater(t, leaseTTL, time.Duration(0))
			require.LessOrEqual(t, leaseTTL, lease)
			close(release)
			require.Equal(t, http.StatusCreated, <-done)
			release = make(chan struct{})
			record, leaseTTL = ttls(c.key)
			require.Greater(t, record, c.min, "%s, completed", c.key)
			require.LessOrEqual(t, record, c.max-lease, "%s, completed: the retention", c.key)
			require.Equal(t, -2*time.Nanosecond, leaseTTL, "no lease once completed")
		}
		for _, bad := range []time.Duration{0, -time.Second} {
			require.Panics(t, func() { g.Middleware(idem.WithRouteRetention(bad)) })
		}
	})
}

// TestHeadersAgree: the client's names of the headers are the middleware's.
func TestHeadersAgree(t *testing.T) {
	require.Equal(t, "Idempotent-Replayed", idem.ReplayedHeader)
	require.Equal(t, idem.ReplayedHeader, idemclient.ReplayedHeader)
}
