package auth

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/testpki"
)

// tlsServer accepts TLS connections with cfg and completes each
// handshake, until the test ends.
func tlsServer(t *testing.T, cfg *tls.Config) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tc := tls.Server(c, cfg)
			_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
			_ = tc.Handshake()
			tc.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

func handshake(addr string, cfg *tls.Config) (*tls.ConnectionState, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	// TLS 1.3: a refused client certificate shows at the first read.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != nil && !isEOF(err) {
		return nil, err
	}
	st := c.ConnectionState()
	return &st, nil
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }

// TestServerTLSReload: replacing the certificate files is seen by the
// next handshake, without a restart; a half-written replacement keeps
// the last good certificate.
func TestServerTLSReload(t *testing.T) {
	pki := testpki.New(t)
	dir := t.TempDir()
	now := time.Now()
	cert, key := testpki.WritePair(t, dir, "server", pki.Leaf(t, "master-v1", true, now.Add(-time.Hour), now.Add(time.Hour)))
	cfg, err := ServerTLS(TLSFiles{Cert: cert, Key: key})
	require.NoError(t, err)
	addr := tlsServer(t, cfg)
	client := &tls.Config{RootCAs: pki.Pool}

	st, err := handshake(addr, client)
	require.NoError(t, err)
	assert.Equal(t, "master-v1", st.PeerCertificates[0].Subject.CommonName)

	testpki.WritePair(t, dir, "server", pki.Leaf(t, "master-v2-renewed", true, now.Add(-time.Hour), now.Add(time.Hour)))
	st, err = handshake(addr, client)
	require.NoError(t, err)
	assert.Equal(t, "master-v2-renewed", st.PeerCertificates[0].Subject.CommonName)

	// A broken file: handshakes keep the last good certificate.
	require.NoError(t, writeAll(cert, []byte("-----BEGIN CERTIFICATE-----\ntrunc")))
	st, err = handshake(addr, client)
	require.NoError(t, err)
	assert.Equal(t, "master-v2-renewed", st.PeerCertificates[0].Subject.CommonName)
}

func writeAll(path string, b []byte) error { return os.WriteFile(path, b, 0o600) }

// TestServerTLSClientCerts: with a CA (mTLS), a client with a
// certificate of that CA is admitted; no certificate, an expired one and
// one from another CA are refused.
func TestServerTLSClientCerts(t *testing.T) {
	pki, other := testpki.New(t), testpki.New(t)
	dir := t.TempDir()
	cert, key := testpki.WritePair(t, dir, "server", pki.Server)
	cfg, err := ServerTLS(TLSFiles{Cert: cert, Key: key, CA: pki.WriteCA(t, dir)})
	require.NoError(t, err)
	addr := tlsServer(t, cfg)
	with := func(c ...tls.Certificate) *tls.Config { return &tls.Config{RootCAs: pki.Pool, Certificates: c} }

	_, err = handshake(addr, with(pki.Client))
	require.NoError(t, err)
	for name, c := range map[string]*tls.Config{
		"no certificate": with(), "expired": with(pki.Expired(t)), "another CA": with(other.Client),
	} {
		_, err := handshake(addr, c)
		assert.Error(t, err, name)
	}
	// A client that does not trust the server refuses it.
	_, err = handshake(addr, &tls.Config{RootCAs: other.Pool, Certificates: []tls.Certificate{pki.Client}})
	assert.ErrorContains(t, err, "certificate")
}

func TestTLSFilesErrors(t *testing.T) {
	_, err := ServerTLS(TLSFiles{Cert: "x"})
	assert.ErrorContains(t, err, "go together")
	_, err = ServerTLS(TLSFiles{CA: "x"})
	assert.ErrorContains(t, err, "needs --tls_cert")
	_, err = ServerTLS(TLSFiles{Cert: "/nonexistent", Key: "/nonexistent"})
	assert.Error(t, err)
	c, err := ServerTLS(TLSFiles{})
	assert.NoError(t, err)
	assert.Nil(t, c)
	_, err = ClientTLS(TLSFiles{CA: "/nonexistent"})
	assert.Error(t, err)
}
