// Package redisauth recognises a Redis server's refusal of a client's
// credentials, so that idem says once that authentication failed, and as
// which user, instead of reporting every command the server then refuses
// as a missing permission.
//
// Redis refuses credentials with two replies: WRONGPASS, for a wrong
// password, a user that does not exist and a disabled user alike (Redis
// does not tell them apart), and NOAUTH, when the server needs a password
// and the client gave none.
package redisauth

import (
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Refused reports whether err is the server's refusal of the client's
// credentials: a WRONGPASS or NOAUTH reply.
func Refused(err error) bool {
	_, ok := reply(err)
	return ok
}

// reply returns the WRONGPASS or NOAUTH reply in err's chain.
func reply(err error) (redis.Error, bool) {
	var r redis.Error
	if err == nil || !errors.As(err, &r) {
		return nil, false
	}
	msg := r.Error()
	return r, strings.HasPrefix(msg, "WRONGPASS") || strings.HasPrefix(msg, "NOAUTH")
}

// User returns the user a client logs in as: its configured username, or
// "default" (Redis's user for a client that names none). It returns "" for
// a client of another type than go-redis's Client and ClusterClient, whose
// options it cannot read.
func User(c any) string {
	var user string
	switch c := c.(type) {
	case interface{ Options() *redis.Options }:
		user = c.Options().Username
	case interface{ Options() *redis.ClusterOptions }:
		user = c.Options().Username
	default:
		return ""
	}
	if user == "" {
		return "default"
	}
	return user
}

// An Error is a server's refusal of a client's credentials.
type Error struct {
	Addr  string      // the server, as messages name it
	User  string      // the user the client logs in as; "" when unknown
	Reply redis.Error // WRONGPASS or NOAUTH
}

// Error says that authentication failed, as which user, what the server's
// reply means and the reply itself, on one line.
func (e *Error) Error() string {
	as := "the client's user"
	if e.User != "" {
		as = fmt.Sprintf("user %q", e.User)
	}
	why := "a wrong password, or no such user, or the user is disabled"
	if strings.HasPrefix(e.Reply.Error(), "NOAUTH") {
		why = "the server needs a password and the client gave none"
	}
	return fmt.Sprintf("Redis at %s: authentication failed as %s (%s): %v", e.Addr, as, why, e.Reply)
}

// Unwrap returns the server's reply.
func (e *Error) Unwrap() error { return e.Reply }

// Explain returns err as an *Error of the server at addr and the client's
// user when err is a refusal of the client's credentials that no *Error
// explains yet; otherwise it returns err unchanged.
func Explain(err error, addr string, client any) error {
	var done *Error
	r, ok := reply(err)
	if !ok || errors.As(err, &done) {
		return err
	}
	return &Error{Addr: addr, User: User(client), Reply: r}
}
