package store

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/internal/testpki"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
)

// TestMasterMTLS: a master with --tls_cert/--tls_key/--tls_ca serves
// clients presenting a certificate of the CA, over crpc and gRPC; it
// refuses a client without a certificate, with an expired one, with one
// of another CA, and a plaintext client; replaced certificate files are
// served at the next handshake.
func TestMasterMTLS(t *testing.T) {
	pki, other := testpki.New(t), testpki.New(t)
	dir := t.TempDir()
	ca := pki.WriteCA(t, dir)
	now := time.Now()
	scert, skey := testpki.WritePair(t, dir, "server", pki.Leaf(t, "master-v1", true, now.Add(-time.Hour), now.Add(time.Hour)))
	tc, err := auth.ServerTLS(auth.TLSFiles{Cert: scert, Key: skey, CA: ca})
	require.NoError(t, err)
	sm := startSecureMaster(t, master.Config{}, nil, service.WithTransportSecurity(tc, nil, nil))
	ccert, ckey := testpki.WritePair(t, dir, "client", pki.Client)
	withFiles := func(cert, key string) func(*Config) {
		return func(c *Config) { c.TLSCA, c.TLSCert, c.TLSKey = ca, cert, key }
	}
	ctx := tctx(t)
	for _, proto := range []string{"auto", "crpc", "grpc"} {
		c := newTestClient(t, sm.testMaster, 8<<20, withFiles(ccert, ckey), func(c *Config) { c.MasterProtocol = proto })
		require.NoError(t, c.Put(ctx, "k-"+proto, []byte("v"), ReplicateConfig{}), proto)
	}

	ecert, ekey := testpki.WritePair(t, dir, "expired", pki.Expired(t))
	ocert, okey := testpki.WritePair(t, dir, "other", other.Client)
	for name, mod := range map[string]func(*Config){
		"no client certificate": func(c *Config) { c.TLSCA = ca },
		"expired certificate":   withFiles(ecert, ekey),
		"another CA's":          withFiles(ocert, okey),
	} {
		cfg := Config{MasterAddr: sm.addr, MasterProtocol: "crpc", LocalHostname: "127.0.0.1", LocalBufferSize: 1 << 20, Logger: quiet, RPCTimeout: 5 * time.Second}
		mod(&cfg)
		_, err := New(ctx, cfg)
		assert.Error(t, err, name)
	}
	_, err = New(ctx, Config{MasterAddr: sm.addr, MasterProtocol: "crpc", LocalHostname: "127.0.0.1", LocalBufferSize: 1 << 20, Logger: quiet})
	assert.ErrorIs(t, err, crpc.ErrTLSRequired, "plaintext")

	// Renewal: new files, no restart.
	testpki.WritePair(t, dir, "server", pki.Leaf(t, "master-v2", true, now.Add(-time.Hour), now.Add(time.Hour)))
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", sm.addr,
		&tls.Config{RootCAs: pki.Pool, Certificates: []tls.Certificate{pki.Client}, NextProtos: []string{"crpc"}})
	require.NoError(t, err)
	st := conn.ConnectionState()
	conn.Close()
	assert.Equal(t, "master-v2", st.PeerCertificates[0].Subject.CommonName)
	assert.Equal(t, "crpc", st.NegotiatedProtocol)
	c := newTestClient(t, sm.testMaster, 0, withFiles(ccert, ckey), func(c *Config) { c.MasterProtocol = "grpc" })
	require.NoError(t, c.Put(ctx, "after-renewal", []byte("v"), ReplicateConfig{}))
}
