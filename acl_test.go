package idem_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/redistest"
)

// The tests of this file run idem as operators deploy it: under Redis ACL
// users limited to idem's keys, channels and commands. The least-privilege
// lines come from docs/operations.md, word for word.

// docACLLines returns ACL SETUSER lines of docs/operations.md: the
// application's user (idem), then the command line's (idem-ops). The
// verify user's line is tested by cmd/idem.
func docACLLines(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile("docs/operations.md")
	require.NoError(t, err)
	byUser := map[string][]string{}
	for _, l := range strings.Split(string(doc), "\n") {
		if f := strings.Fields(l); strings.HasPrefix(l, "ACL SETUSER ") && len(f) > 2 {
			byUser[f[2]] = append(byUser[f[2]], l)
		}
	}
	require.Len(t, byUser["idem"], 1, "docs/operations.md must give the application's ACL line once")
	require.Len(t, byUser["idem-ops"], 1, "docs/operations.md must give the command line's ACL line once")
	return []string{byUser["idem"][0], byUser["idem-ops"][0]}
}

// aclUser creates the user of an ACL SETUSER line on each server, with the
// password "pw" and, when prefix is not "idem", the line's key and channel
// patterns moved to prefix. It returns the user's name; the user is deleted
// when the test ends.
func aclUser(t *testing.T, line, prefix string, admins ...*redis.Client) string {
	t.Helper()
	line = strings.ReplaceAll(line, ">PASSWORD", ">pw")
	if prefix != "idem" {
		line = strings.ReplaceAll(line, "~idem:*", "~"+prefix+":*")
		line = strings.ReplaceAll(line, "&idem:*", "&"+prefix+":*")
	}
	fields := strings.Fields(line)
	user := strings.ReplaceAll(t.Name(), "/", "-")
	fields[2] = user
	args := make([]any, len(fields))
	for i, f := range fields {
		args[i] = f
	}
	ctx := context.Background()
	for _, a := range admins {
		require.NoError(t, a.Do(ctx, args...).Err(), "%s", line)
		t.Cleanup(func() { a.Do(context.Background(), "ACL", "DELUSER", user) })
	}
	return user
}

// userClient returns a client of srv that logs in as user.
func userClient(t *testing.T, srv *redistest.Server, user string) *redis.Client {
	t.Helper()
	o := srv.Options()
	o.Username, o.Password = user, "pw"
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// TestACLLeastPrivilege runs the store contract, Do, a notified waiter, the
// middleware and Check under the documented least-privilege user.
func TestACLLeastPrivilege(t *testing.T) {
	srv := redistest.Start(t)
	user := aclUser(t, docACLLines(t)[0], "idem", srv.Client(t))
	c := userClient(t, srv, user)

	t.Run("contract", func(t *testing.T) {
		idemtest.Run(t, idemtest.Harness{
			New: func(t *testing.T) (idemstore.Store, func(time.Duration)) {
				return idem.NewRedisStore(c), time.Sleep
			},
			Lease: 400 * time.Millisecond,
		})
	})
	t.Run("usable", func(t *testing.T) {
		checkUsableAs(t, c, "idem", true)
	})
	t.Run("check", func(t *testing.T) {
		log, records := recordingLogger()
		require.NoError(t, idem.NewRedisStore(c, idem.WithStoreLogger(log)).Check(context.Background()))
		require.Empty(t, records(), "the line grants INFO, which gives the version and the eviction policy, and the channels: no warning")
	})
}

// TestACLPrefix: the documented line with another prefix serves a store
// WithPrefix("billing"); the line of the default prefix does not, and
// Check names the prefix it lacks.
func TestACLPrefix(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	line := docACLLines(t)[0]
	t.Run("billing", func(t *testing.T) {
		c := userClient(t, srv, aclUser(t, line, "billing", admin))
		checkUsableAs(t, c, "billing", true)
		require.NoError(t, idem.NewRedisStore(c, idem.WithPrefix("billing")).Check(context.Background()))
	})
	t.Run("other", func(t *testing.T) {
		c := userClient(t, srv, aclUser(t, line, "idem", admin))
		err := idem.NewRedisStore(c, idem.WithPrefix("billing")).Check(context.Background())
		require.ErrorContains(t, err, "billing:*")
	})
}

// TestACLNoDangerous: a user of the usual hand-written form, all commands
// but the dangerous ones, on idem's keys and channels.
func TestACLNoDangerous(t *testing.T) {
	srv := redistest.Start(t)
	line := "ACL SETUSER x on >PASSWORD ~idem:* &idem:* +@all -@dangerous"
	c := userClient(t, srv, aclUser(t, line, "idem", srv.Client(t)))
	checkUsableAs(t, c, "idem", true)
	log, records := recordingLogger()
	require.NoError(t, idem.NewRedisStore(c, idem.WithStoreLogger(log)).Check(context.Background()),
		"INFO and CONFIG refused are warnings, never errors by themselves")
	require.Contains(t, records(), "event=version_unverified")
}

// TestACLNoChannels: without channel permissions (Redis 7's default for a
// new user) a completion that cannot notify its waiters still stands: the
// caller gets its result, repeats replay, waiters poll, and the store warns
// once.
func TestACLNoChannels(t *testing.T) {
	srv := redistest.Start(t)
	line := "ACL SETUSER x on >PASSWORD ~idem:* resetchannels +@all -@dangerous"
	c := userClient(t, srv, aclUser(t, line, "idem", srv.Client(t)))
	log, records := recordingLogger()
	checkUsableAs(t, c, "idem", false, idem.WithStoreLogger(log))
	require.Equal(t, 1, strings.Count(records(), "event=notify_refused"), "one warning, not one per request:\n%s", records())

	log, records = recordingLogger()
	require.NoError(t, idem.NewRedisStore(c, idem.WithStoreLogger(log)).Check(context.Background()))
	require.Contains(t, records(), "waiters will poll")
}

// checkUsableAs proves a store on c usable: fresh calls return their
// result, repeats replay it, a released key runs again, the middleware runs
// its handler once, and a waiter is notified of a completion (when notified
// is set) or falls back to polling (it is still served).
func checkUsableAs(t *testing.T, c *redis.Client, prefix string, notified bool, opts ...idem.RedisOption) {
	t.Helper()
	ctx := context.Background()
	store := idem.NewRedisStore(c, append([]idem.RedisOption{idem.WithPrefix(prefix)}, opts...)...)
	g := idem.New(store, idem.WithWait(5*time.Second))
	var runs atomic.Int32
	fn := func(v string) func(context.Context, *idem.Attempt) (string, error) {
		return func(context.Context, *idem.Attempt) (string, error) { runs.Add(1); return v, nil }
	}
	for i := range 3 {
		key := "acl-" + string(rune('a'+i))
		v, err := idem.Do(ctx, g, key, nil, fn("first"))
		require.NoError(t, err, "a stored result is never reported lost")
		require.Equal(t, "first", v)
		v, err = idem.Do(ctx, g, key, nil, fn("second"))
		require.NoError(t, err)
		require.Equal(t, "first", v, "the repeat replays")
	}
	require.EqualValues(t, 3, runs.Load())

	// A released claim runs again.
	_, err := idem.Do(ctx, g, "acl-released", nil, func(context.Context, *idem.Attempt) (string, error) {
		return "", io.ErrUnexpectedEOF
	})
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	v, err := idem.Do(ctx, g, "acl-released", nil, fn("again"))
	require.NoError(t, err)
	require.Equal(t, "again", v)

	// A waiter: notified of the completion, or polling.
	id := idem.OperationID(idem.KindDo, "", "acl-wait")
	notify, stop, err := store.Watch(ctx, id)
	if notified {
		require.NoError(t, err)
		defer stop()
	} else {
		require.Error(t, err, "without channels a waiter polls")
	}
	claimed, release := make(chan struct{}), make(chan struct{})
	holder := make(chan error, 1)
	go func() {
		_, err := idem.Do(ctx, g, "acl-wait", nil, func(context.Context, *idem.Attempt) (string, error) {
			close(claimed)
			<-release
			return "held", nil
		})
		holder <- err
	}()
	<-claimed
	waiter := make(chan string, 1)
	go func() {
		v, _ := idem.Do(ctx, g, "acl-wait", nil, fn("waiter"))
		waiter <- v
	}()
	close(release)
	require.NoError(t, <-holder)
	require.Equal(t, "held", <-waiter)
	if notified {
		<-notify
	}

	// The middleware: one run, then the stored response.
	var handled atomic.Int32
	h := g.Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handled.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "made")
	}))
	for i := range 2 {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "acl-http")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
		require.Equal(t, "made", rec.Body.String())
		require.Equal(t, i == 1, rec.Header().Get("Idempotent-Replayed") == "true")
	}
	require.EqualValues(t, 1, handled.Load())
}

// TestACLLinesInReadme: the README's production section shows the
// application's ACL line of docs/operations.md, word for word.
func TestACLLinesInReadme(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	require.Contains(t, string(readme), docACLLines(t)[0])
}
