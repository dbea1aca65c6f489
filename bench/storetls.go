package bench

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"time"
)

// BaselineTLSOff is the baseline of StoreConfig.TLS: the same workload on
// a second in-process master and clients without TLS.
const BaselineTLSOff = "tls_off"

// benchTLS is a throwaway CA with a server certificate for 127.0.0.1 and
// a client certificate: the in-process master requires the client's
// (mTLS), as crescent-master does with --tls_ca.
type benchTLS struct{ server, client *tls.Config }

func newBenchTLS() (*benchTLS, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "crescent-bench CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	leaf := func(serial int64, usage x509.ExtKeyUsage, ips ...net.IP) (tls.Certificate, error) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return tls.Certificate{}, err
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "crescent-bench"},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			return tls.Certificate{}, err
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}, nil
	}
	srv, err := leaf(2, x509.ExtKeyUsageServerAuth, net.IPv4(127, 0, 0, 1), net.IPv6loopback)
	if err != nil {
		return nil, err
	}
	cli, err := leaf(3, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &benchTLS{
		server: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{srv}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert},
		client: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cli}, RootCAs: pool},
	}, nil
}

// withoutTLS is c for the tls_off baseline's master and clients.
func (c *StoreConfig) withoutTLS() *StoreConfig {
	p := *c
	p.TLS, p.tls = false, nil
	return &p
}
