// Package testpki makes a throwaway certificate authority for tests: a CA,
// a server certificate for 127.0.0.1 and a client certificate, valid for
// an hour, kept in memory.
package testpki

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

// ClientName is the client certificate's common name.
const ClientName = "client-7"

// PKI is a CA with one server and one client certificate.
type PKI struct {
	Pool           *x509.CertPool // the CA
	Server, Client tls.Certificate
	ca             *x509.Certificate
	caKey          *ecdsa.PrivateKey
}

// New generates a PKI (ECDSA P-256).
func New(t testing.TB) *PKI {
	t.Helper()
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "crescent test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	must(err)
	ca, err := x509.ParseCertificate(caDER)
	must(err)
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage, ips ...net.IP) tls.Certificate {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		must(err)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		must(err)
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}
	}
	p := &PKI{Pool: x509.NewCertPool(), ca: ca, caKey: caKey}
	p.Pool.AddCert(ca)
	p.Server = leaf(2, "master", x509.ExtKeyUsageServerAuth, net.IPv4(127, 0, 0, 1))
	p.Client = leaf(3, ClientName, x509.ExtKeyUsageClientAuth)
	return p
}

// ServerTLS requires a client certificate signed by the CA (mTLS).
func (p *PKI) ServerTLS() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{p.Server}, ClientCAs: p.Pool, ClientAuth: tls.RequireAndVerifyClientCert}
}

// ClientTLS trusts the CA and, withCert, presents the client certificate.
func (p *PKI) ClientTLS(withCert bool) *tls.Config {
	c := &tls.Config{RootCAs: p.Pool}
	if withCert {
		c.Certificates = []tls.Certificate{p.Client}
	}
	return c
}

// Leaf signs a new certificate valid from notBefore to notAfter: a
// server certificate for 127.0.0.1 (and ips), or a client one.
func (p *PKI) Leaf(t testing.TB, cn string, server bool, notBefore, notAfter time.Time, ips ...net.IP) tls.Certificate {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	usage := x509.ExtKeyUsageClientAuth
	if server {
		usage = x509.ExtKeyUsageServerAuth
		ips = append(ips, net.IPv4(127, 0, 0, 1))
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: notBefore, NotAfter: notAfter, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &k.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}
}

// Expired is a client certificate of this CA that expired an hour ago.
func (p *PKI) Expired(t testing.TB) tls.Certificate {
	now := time.Now()
	return p.Leaf(t, "expired-client", false, now.Add(-2*time.Hour), now.Add(-time.Hour))
}

// WriteCA writes the CA certificate as PEM into dir and returns its path.
func (p *PKI) WriteCA(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.ca.Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// WritePair writes c as name.pem and name-key.pem into dir (replacing
// them atomically, for reload tests) and returns their paths.
func WritePair(t testing.TB, dir, name string, c tls.Certificate) (certPath, keyPath string) {
	t.Helper()
	kb, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	var cb []byte
	for _, der := range c.Certificate {
		cb = append(cb, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	certPath, keyPath = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	for _, f := range []struct {
		path string
		b    []byte
	}{{keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb})}, {certPath, cb}} {
		tmp := f.path + ".tmp"
		if err := os.WriteFile(tmp, f.b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, f.path); err != nil {
			t.Fatal(err)
		}
	}
	return certPath, keyPath
}
