package main

import (
	"crypto/tls"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/redistest"
)

// TestTLS: with rediss:// and -cacert naming the CA that signed the
// server's certificate, check and inspect work on a TLS-only server.
func TestTLS(t *testing.T) {
	ca := redistest.NewCA(t)
	srv := redistest.StartTLS(t, ca)
	url := "rediss://" + srv.Addr()
	s := seed(t, url, srv.Client(t))

	code, out, errOut := cli(t, "check", "-redis", url, "-cacert", ca.File)
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, serverLine(srv.Addr()), out)
	require.Contains(t, out, "ok: idem can use "+srv.Addr())

	in := inspectJSON(t, "-redis", url, "-cacert", ca.File, "-prefix", s.prefix, "paid")
	require.Equal(t, "completed", in.State)
}

// TestTLSWrongCA: a server whose certificate the client does not trust is
// a one-line error naming -cacert, exit status 1; the command's -timeout
// bounds it, so a hang would fail the test at its own deadline.
func TestTLSWrongCA(t *testing.T) {
	srv := redistest.StartTLS(t, redistest.NewCA(t))
	url := "rediss://" + srv.Addr()
	other := redistest.NewCA(t)
	tests := []struct {
		name string
		args []string
	}{
		{"another CA", []string{"-cacert", other.File}},
		{"system roots", nil},
	}
	for _, tt := range tests {
		for _, command := range []string{"check", "inspect"} {
			t.Run(tt.name+"/"+command, func(t *testing.T) {
				args := append([]string{command, "-redis", url, "-timeout", "20s"}, tt.args...)
				if command == "inspect" {
					args = append(args, "k")
				}
				code, out, errOut := cli(t, args...)
				require.Equal(t, exitFail, code, out)
				require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
				require.Contains(t, errOut, "certificate signed by unknown authority")
				require.Contains(t, errOut, "-cacert FILE or SSL_CERT_FILE")
				require.NotContains(t, errOut, "no answer within", "an answer, not a timeout")
			})
		}
	}
}

// TestTLSUsage: -cacert must name a readable PEM file, for a TLS URL.
func TestTLSUsage(t *testing.T) {
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600))
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"plain URL", []string{"-redis", "redis://127.0.0.1:1", "-cacert", redistest.NewCA(t).File}, "-cacert applies to TLS URLs only (rediss://"},
		{"missing file", []string{"-redis", "rediss://127.0.0.1:1", "-cacert", notPEM + ".none"}, "-cacert: open "},
		{"not PEM", []string{"-redis", "rediss://127.0.0.1:1", "-cacert", notPEM}, "-cacert: no PEM certificate in " + notPEM},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := cli(t, append([]string{"check"}, tt.args...)...)
			require.Equal(t, exitUsage, code, errOut)
			require.Contains(t, errOut, tt.want)
		})
	}
}

// TestTLSCertFileEnv: SSL_CERT_FILE names the CA as well, for a process
// that reads it at start (the test binary re-executed as the command, see
// TestBinary).
func TestTLSCertFileEnv(t *testing.T) {
	bin, err := os.Executable()
	require.NoError(t, err)
	ca := redistest.NewCA(t)
	srv := redistest.StartTLS(t, ca)
	cmd := exec.Command(bin, "check", "-redis", "rediss://"+srv.Addr())
	cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+ca.File, asCommandEnv+"=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	require.Contains(t, string(out), "ok: idem can use "+srv.Addr())
}

// TestTLSSchemeMismatch: redis:// to a TLS-only server, and rediss:// to a
// server without TLS, are one-line errors that name the other scheme; the
// latter, which answers no handshake, ends at the dial timeout.
func TestTLSSchemeMismatch(t *testing.T) {
	tlsOnly := redistest.StartTLS(t, redistest.NewCA(t))
	plain := redistest.Shared(t)
	tests := []struct {
		name, url, want string
	}{
		{"plain URL, TLS server", "redis://" + tlsOnly.Addr(), "if it requires TLS, use rediss://"},
		{"TLS URL, plain server", "rediss://" + plain.Addr() + "?dial_timeout=500ms", "no TLS answer: if the server does not use TLS, use redis://"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := cli(t, "check", "-redis", tt.url, "-timeout", "20s")
			require.Equal(t, exitFail, code, out)
			require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
			require.Contains(t, errOut, tt.want)
		})
	}
}

// TestConnectTLS: -cacert's CAs reach every kind of TLS client.
func TestConnectTLS(t *testing.T) {
	roots := redistest.NewCA(t).Pool
	for _, url := range []string{"rediss://h:6379", "rediss+sentinel://s1,s2/mymaster", "rediss+cluster://h1,h2"} {
		t.Run(url, func(t *testing.T) {
			c, _, err := connect(url, roots)
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			var tc *tls.Config
			var dialer any
			switch c := c.(type) {
			case *redis.Client:
				tc, dialer = c.Options().TLSConfig, c.Options().Dialer
			case *redis.ClusterClient:
				tc, dialer = c.Options().TLSConfig, c.Options().Dialer
			}
			require.NotNil(t, tc)
			require.Same(t, roots, tc.RootCAs)
			require.NotNil(t, dialer, "a dialer bounded by the dial timeout and the context")
		})
	}
}
