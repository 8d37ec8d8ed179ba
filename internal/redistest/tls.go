package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// certValidity is how long the certificates of a test CA are valid: long
// enough for any test, short enough to be useless afterwards.
const certValidity = time.Hour

// A CA is a certificate authority made for one test: an ECDSA key and a
// self-signed certificate, written as PEM to File in the test's temporary
// directory. It signs the certificates of servers started by StartTLS.
type CA struct {
	File string         // the CA certificate, PEM
	Pool *x509.CertPool // holds only the CA certificate, for tls.Config.RootCAs

	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
}

// NewCA makes a certificate authority for tb. Two calls make two unrelated
// authorities: a client trusting one rejects servers of the other.
func NewCA(tb testing.TB) *CA {
	tb.Helper()
	ca := &CA{dir: tb.TempDir(), key: newKey(tb)}
	tmpl := certTemplate(tb, "idem redistest CA")
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &ca.key.PublicKey, ca.key)
	if err != nil {
		tb.Fatalf("redistest: CA certificate: %v", err)
	}
	if ca.cert, err = x509.ParseCertificate(der); err != nil {
		tb.Fatalf("redistest: CA certificate: %v", err)
	}
	ca.Pool = x509.NewCertPool()
	ca.Pool.AddCert(ca.cert)
	ca.File = writePEM(tb, ca.dir, "ca.pem", "CERTIFICATE", der)
	return ca
}

// TLSConfig returns a client configuration that trusts only the CA.
func (ca *CA) TLSConfig() *tls.Config {
	return &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}
}

// serverCert issues a certificate for 127.0.0.1 and returns the paths of
// its PEM certificate and key files.
func (ca *CA) serverCert(tb testing.TB) (certFile, keyFile string) {
	tb.Helper()
	key := newKey(tb)
	tmpl := certTemplate(tb, "127.0.0.1")
	tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatalf("redistest: server certificate: %v", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatalf("redistest: server key: %v", err)
	}
	dir := tb.TempDir()
	return writePEM(tb, dir, "server.pem", "CERTIFICATE", der), writePEM(tb, dir, "server.key", "EC PRIVATE KEY", keyDER)
}

// StartTLS starts a redis-server like Start, listening on 127.0.0.1 with
// TLS only (--port 0, --tls-port), with a certificate for 127.0.0.1 signed
// by ca. Clients need no certificate of their own. Options and Client
// connect with TLS, trusting ca; Addr is the TLS port's address.
func StartTLS(tb testing.TB, ca *CA, opts ...Option) *Server {
	tb.Helper()
	path := lookPath(tb, "redis-server", skipServer)
	var c config
	for _, o := range opts {
		o(&c)
	}
	certFile, keyFile := ca.serverCert(tb)
	args := append([]string{
		"--tls-cert-file", certFile,
		"--tls-key-file", keyFile,
		"--tls-ca-cert-file", ca.File,
		"--tls-auth-clients", "no",
	}, c.args...)
	s, err := start(&Server{path: path, dir: tb.TempDir(), args: args, tls: ca.TLSConfig()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.stopNow)
	return s
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("redistest: key: %v", err)
	}
	return key
}

// certTemplate returns a certificate template valid from a minute ago (for
// clocks a little apart) for certValidity.
func certTemplate(tb testing.TB, name string) *x509.Certificate {
	tb.Helper()
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		tb.Fatalf("redistest: serial: %v", err)
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(certValidity),
	}
}

// writePEM writes one PEM block to dir/name and returns its path.
func writePEM(tb testing.TB, dir, name, typ string, der []byte) string {
	tb.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	return path
}
