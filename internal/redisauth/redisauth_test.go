package redisauth

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// serverReply is an error reply of the server, as go-redis returns one.
type serverReply string

func (r serverReply) Error() string { return string(r) }
func (serverReply) RedisError()     {}

func TestRefused(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{name: "WRONGPASS", err: serverReply("WRONGPASS invalid username-password pair or user is disabled."), want: true},
		{name: "NOAUTH, wrapped", err: fmt.Errorf("reading: %w", serverReply("NOAUTH Authentication required.")), want: true},
		{name: "NOPERM", err: serverReply("NOPERM this user has no permissions to run the 'info' command")},
		{name: "not a reply", err: errors.New("WRONGPASS lookalike")},
		{name: "network", err: io.EOF},
		{name: "nil"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, Refused(tt.err))
		})
	}
}

func TestUser(t *testing.T) {
	require.Equal(t, "app", User(redis.NewClient(&redis.Options{Username: "app"})))
	require.Equal(t, "default", User(redis.NewClient(&redis.Options{})))
	require.Equal(t, "ops", User(redis.NewClusterClient(&redis.ClusterOptions{Username: "ops"})))
	require.Equal(t, "", User(struct{}{}), "unknown")
}

// TestExplain: a refusal becomes one *Error naming the server and the user,
// once; anything else is returned as it is.
func TestExplain(t *testing.T) {
	c := redis.NewClient(&redis.Options{Username: "app"})
	err := Explain(fmt.Errorf("h:1: %w", serverReply("WRONGPASS invalid username-password pair or user is disabled.")), "h:1", c)
	var e *Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, `Redis at h:1: authentication failed as user "app" (a wrong password, or no such user, or the user is disabled): WRONGPASS invalid username-password pair or user is disabled.`, err.Error())
	again := Explain(fmt.Errorf("more: %w", err), "h:2", c)
	require.Equal(t, "more: "+err.Error(), again.Error(), "explained once")

	err = Explain(serverReply("NOAUTH Authentication required."), "h:1", struct{}{})
	require.Equal(t, "Redis at h:1: authentication failed as the client's user (the server needs a password and the client gave none): NOAUTH Authentication required.", err.Error())

	require.Equal(t, io.EOF, Explain(io.EOF, "h:1", c))
	require.NoError(t, Explain(nil, "h:1", c))
}
