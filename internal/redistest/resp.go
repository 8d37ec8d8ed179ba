package redistest

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"
)

// errMalformed reports bytes that are not valid RESP.
var errMalformed = errors.New("redistest: malformed RESP")

// respLine returns the line starting at b[i] without its CRLF, and the index
// after the CRLF; ok is false when the line is not complete yet.
func respLine(b []byte, i int) (line []byte, next int, ok bool) {
	j := bytes.Index(b[i:], []byte("\r\n"))
	if j < 0 {
		return nil, 0, false
	}
	return b[i : i+j], i + j + 2, true
}

// frameReply returns the length of the first complete RESP2 or RESP3 reply in
// b, counting attributes that precede it as part of it. ok is false when b
// holds only part of a reply.
func frameReply(b []byte) (n int, ok bool, err error) {
	return frameAt(b, 0, 0)
}

func frameAt(b []byte, i, depth int) (int, bool, error) {
	if depth > 64 {
		return 0, false, errMalformed
	}
	if i >= len(b) {
		return 0, false, nil
	}
	typ := b[i]
	line, next, ok := respLine(b, i+1)
	if !ok {
		return 0, false, nil
	}
	switch typ {
	case '+', '-', ':', ',', '#', '(', '_':
		return next, true, nil
	case '$', '!', '=':
		size, err := strconv.Atoi(string(line))
		if err != nil {
			return 0, false, errMalformed
		}
		if size < 0 {
			return next, true, nil
		}
		end := next + size + 2
		if end > len(b) {
			return 0, false, nil
		}
		return end, true, nil
	case '*', '~', '>', '%', '|':
		count, err := strconv.Atoi(string(line))
		if err != nil {
			return 0, false, errMalformed
		}
		if typ == '%' || typ == '|' {
			count *= 2
		}
		for ; count > 0; count-- {
			next, ok, err = frameAt(b, next, depth+1)
			if !ok || err != nil {
				return 0, ok, err
			}
		}
		if typ == '|' { // an attribute is followed by the reply it annotates
			return frameAt(b, next, depth+1)
		}
		return next, true, nil
	default:
		return 0, false, errMalformed
	}
}

// parseCommand parses the first complete command in b, written as a RESP
// array of bulk strings (the only form go-redis writes). ok is false when b
// holds only part of a command.
func parseCommand(b []byte) (args []string, n int, ok bool, err error) {
	if len(b) == 0 {
		return nil, 0, false, nil
	}
	if b[0] != '*' {
		return nil, 0, false, errMalformed
	}
	line, next, ok := respLine(b, 1)
	if !ok {
		return nil, 0, false, nil
	}
	count, err := strconv.Atoi(string(line))
	if err != nil || count < 0 {
		return nil, 0, false, errMalformed
	}
	args = make([]string, 0, count)
	for ; count > 0; count-- {
		if next >= len(b) {
			return nil, 0, false, nil
		}
		if b[next] != '$' {
			return nil, 0, false, errMalformed
		}
		line, next, ok = respLine(b, next+1)
		if !ok {
			return nil, 0, false, nil
		}
		size, err := strconv.Atoi(string(line))
		if err != nil || size < 0 {
			return nil, 0, false, errMalformed
		}
		if next+size+2 > len(b) {
			return nil, 0, false, nil
		}
		args = append(args, string(b[next:next+size]))
		next += size + 2
	}
	return args, next, true, nil
}

// appendCommand appends args to b as a RESP array of bulk strings.
func appendCommand(b []byte, args ...string) []byte {
	b = fmt.Appendf(b, "*%d\r\n", len(args))
	for _, a := range args {
		b = fmt.Appendf(b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b
}

// do sends one command to addr on a fresh connection and returns the reply
// as a string: the text of a simple string, bulk string or integer. A Redis
// error reply is returned as an error. It is the harness's own tiny client,
// so that starting and probing servers needs no go-redis pool.
func do(addr string, timeout time.Duration, args ...string) (string, error) {
	return send(addr, nil, timeout, args...)
}

// send is do over TLS when tc is not nil.
func send(addr string, tc *tls.Config, timeout time.Duration, args ...string) (string, error) {
	var conn net.Conn
	var err error
	d := &net.Dialer{Timeout: timeout}
	if tc != nil {
		conn, err = tls.DialWithDialer(d, "tcp", addr, tc)
	} else {
		conn, err = d.Dial("tcp", addr)
	}
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	if _, err := conn.Write(appendCommand(nil, args...)); err != nil {
		return "", err
	}
	rd := bufio.NewReader(conn)
	var buf []byte
	for {
		n, ok, err := frameReply(buf)
		if err != nil {
			return "", err
		}
		if ok {
			return replyString(buf[:n])
		}
		chunk := make([]byte, 4096)
		m, err := rd.Read(chunk)
		buf = append(buf, chunk[:m]...)
		if err != nil && m == 0 {
			return "", err
		}
	}
}

// replyString converts one framed scalar reply to a string.
func replyString(r []byte) (string, error) {
	line, next, _ := respLine(r, 1)
	switch r[0] {
	case '+', ':', ',', '(', '#':
		return string(line), nil
	case '-', '!':
		if r[0] == '!' {
			return "", fmt.Errorf("redis: %s", bytes.TrimSuffix(r[next:], []byte("\r\n")))
		}
		return "", fmt.Errorf("redis: %s", line)
	case '$', '=':
		size, _ := strconv.Atoi(string(line))
		if size < 0 {
			return "", nil
		}
		return string(r[next : next+size]), nil
	case '_':
		return "", nil
	default:
		return "", fmt.Errorf("redistest: unexpected reply type %q", r[0])
	}
}
