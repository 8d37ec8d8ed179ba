package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/idemkit/idem/internal/redisurl"
)

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
	case redisurl.TLS(url) && strings.Contains(err.Error(), "TLS handshake: ") && errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w (no TLS answer: if the server does not use TLS, use redis://)", err)
	case !redisurl.TLS(url) && errors.Is(err, io.EOF):
		return fmt.Errorf("%w (the server closed the connection: if it requires TLS, use rediss://)", err)
	}
	return err
}
