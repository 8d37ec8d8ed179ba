package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"
)

// loadCACert reads the PEM certificates of -cacert into a pool.
func loadCACert(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("no PEM certificate in %s", file)
	}
	return pool, nil
}

// secure makes a URL's client trust roots instead of the system's
// certificates (roots nil: the system's, which SSL_CERT_FILE names on
// Unix), and returns the dialer that client uses: nil without TLS.
func secure(tc *tls.Config, roots *x509.CertPool, timeout time.Duration) func(context.Context, string, string) (net.Conn, error) {
	if tc == nil {
		return nil
	}
	if roots != nil {
		tc.RootCAs = roots
	}
	return tlsDialer(tc, timeout)
}

// tlsDialer returns a dialer that connects and then runs the TLS handshake,
// both bounded by timeout and ctx (go-redis's own TLS dial ignores ctx), and
// says which of the two failed.
func tlsDialer(tc *tls.Config, timeout time.Duration) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		raw, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cfg := tc
		if cfg.ServerName == "" {
			cfg = tc.Clone()
			cfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		conn := tls.Client(raw, cfg)
		if err := conn.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, fmt.Errorf("TLS handshake: %w", err)
		}
		return conn, nil
	}
}

// tlsScheme reports whether a -redis URL uses TLS.
func tlsScheme(url string) bool {
	scheme, _, _ := strings.Cut(url, "://")
	return scheme == "rediss" || strings.HasPrefix(scheme, "rediss+")
}

// explainTLS adds to a connection error what TLS may have to do with it:
// how to name the CA of a server whose certificate is not trusted, that a
// server which answers no TLS handshake may speak plain RESP, and that one
// which closes a plain connection may require TLS.
func explainTLS(err error, url string) error {
	var unknown x509.UnknownAuthorityError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &unknown) || strings.Contains(err.Error(), "certificate signed by unknown authority"):
		return fmt.Errorf("%w (name the CA that signed the server's certificate with -cacert FILE or SSL_CERT_FILE)", err)
	case tlsScheme(url) && strings.Contains(err.Error(), "TLS handshake: ") && errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w (no TLS answer: if the server does not use TLS, use redis://)", err)
	case !tlsScheme(url) && errors.Is(err, io.EOF):
		return fmt.Errorf("%w (the server closed the connection: if it requires TLS, use rediss://)", err)
	}
	return err
}
