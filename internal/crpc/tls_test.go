package crpc

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/crescent-kv/crescent/internal/netx"
)

// testPKI is a CA with a server certificate for 127.0.0.1 and a client
// certificate, all generated for the test.
type testPKI struct {
	pool           *x509.CertPool
	server, client tls.Certificate
}

func newPKI(t testing.TB) *testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "crescent test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage, ips ...net.IP) tls.Certificate {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		require.NoError(t, err)
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}
	}
	p := &testPKI{pool: x509.NewCertPool()}
	p.pool.AddCert(ca)
	p.server = leaf(2, "master", x509.ExtKeyUsageServerAuth, net.IPv4(127, 0, 0, 1))
	p.client = leaf(3, "client-7", x509.ExtKeyUsageClientAuth)
	return p
}

// serverTLS requires a client certificate signed by the CA (mTLS).
func (p *testPKI) serverTLS() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{p.server}, ClientCAs: p.pool, ClientAuth: tls.RequireAndVerifyClientCert}
}

func (p *testPKI) clientTLS(withCert bool) *tls.Config {
	c := &tls.Config{RootCAs: p.pool}
	if withCert {
		c.Certificates = []tls.Certificate{p.client}
	}
	return c
}

// TestTLS: crpc.Serve with ServerConfig.TLS serves a client with a
// certificate, and refuses one without (mTLS), a plaintext client
// (ErrTLSRequired, said by the server) and a client that does not trust
// the server.
func TestTLS(t *testing.T) {
	pki := newPKI(t)
	lis := listen(t)
	serveOn(t, lis, ServerConfig{TLS: pki.serverTLS()})
	addr := lis.Addr().String()
	ctx := tctx(t)

	c := dial(t, addr, WithTLS(pki.clientTLS(true)))
	got, err := call(ctx, c, "Echo", "sealed")
	require.NoError(t, err)
	require.Equal(t, "echo:sealed", got)
	// Errors keep their details inside TLS too.
	_, err = call(ctx, c, "Fail", "x")
	require.Equal(t, codes.FailedPrecondition, status.Code(err))

	_, err = Dial(ctx, addr)
	require.ErrorIs(t, err, ErrTLSRequired)

	// No client certificate: the server refuses the handshake.
	_, err = Dial(ctx, addr, WithTLS(pki.clientTLS(false)))
	require.Error(t, err)
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.ErrorContains(t, err, "certificate required")

	// A client that does not trust the server's CA.
	_, err = Dial(ctx, addr, WithTLS(&tls.Config{Certificates: []tls.Certificate{pki.client}}))
	require.ErrorContains(t, err, "TLS handshake")

	// TLS to a plaintext server fails clearly too.
	plain := listen(t)
	serveOn(t, plain)
	_, err = Dial(ctx, plain.Addr().String(), WithTLS(pki.clientTLS(true)))
	require.ErrorContains(t, err, "TLS handshake")
}

// TestSplitTLS: on one port, gRPC over TLS and crpc over TLS, both with
// client certificates; gRPC handlers see the client's certificate
// through Credentials; plaintext clients of either are refused.
func TestSplitTLS(t *testing.T) {
	pki := newPKI(t)
	lis := listen(t)
	cl, gl := SplitTLS(lis, netx.Config{}, pki.serverTLS())
	serveOn(t, cl, ServerConfig{TLS: pki.serverTLS()}) // not handshaken twice
	var seenCN atomic.Value
	g := grpc.NewServer(grpc.Creds(Credentials()), grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if p, ok := peer.FromContext(ctx); ok {
			if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
				seenCN.Store(ti.State.PeerCertificates[0].Subject.CommonName)
			}
		}
		return h(ctx, req)
	}))
	g.RegisterService(&testDesc, &testSvc{})
	gdone := make(chan struct{})
	go func() { g.Serve(gl); close(gdone) }()
	defer func() { g.Stop(); <-gdone }()
	ctx := tctx(t)
	addr := lis.Addr().String()

	// A silent peer does not hold the others up while it handshakes.
	raw, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer raw.Close()

	c := dial(t, addr, WithTLS(pki.clientTLS(true)))
	got, err := call(ctx, c, "Echo", "c")
	require.NoError(t, err)
	require.Equal(t, "echo:c", got)

	gc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(pki.clientTLS(true))))
	require.NoError(t, err)
	defer gc.Close()
	got, err = call(ctx, gc, "Echo", "g")
	require.NoError(t, err)
	require.Equal(t, "echo:g", got)
	require.Equal(t, "client-7", seenCN.Load())

	_, err = Dial(ctx, addr)
	require.ErrorIs(t, err, ErrTLSRequired)

	pc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer pc.Close()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = call(sctx, pc, "Echo", "p")
	require.Error(t, err)
}

// TestResolverFailover: a connection with a resolver follows it: once
// the first server has gone, the next call dials where the resolver
// points now and lands on the second server.
func TestResolverFailover(t *testing.T) {
	tag := func(name string) ServerConfig {
		return ServerConfig{Interceptor: func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			resp, err := h(ctx, req)
			if err != nil {
				return nil, err
			}
			return wrapperspb.String(name + ":" + resp.(*wrapperspb.StringValue).Value), nil
		}}
	}
	la, lb := listen(t), listen(t)
	_, _, stopA := serveOn(t, la, tag("A"))
	serveOn(t, lb, tag("B"))
	var target atomic.Value
	target.Store(la.Addr().String())
	var resolved atomic.Int32
	c := dial(t, "unused.invalid:1", WithResolver(func(context.Context) (string, error) {
		resolved.Add(1)
		return target.Load().(string), nil
	}))
	ctx := tctx(t)
	got, err := call(ctx, c, "Echo", "x")
	require.NoError(t, err)
	require.Equal(t, "A:echo:x", got)

	target.Store(lb.Addr().String())
	got, err = call(ctx, c, "Echo", "y")
	require.NoError(t, err)
	require.Equal(t, "A:echo:y", got, "a live connection stays where it is")

	stopA()
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.cur == nil || c.cur.broken()
	}, 10*time.Second, time.Millisecond)
	got, err = call(ctx, c, "Echo", "z")
	require.NoError(t, err)
	require.Equal(t, "B:echo:z", got)
	require.EqualValues(t, 2, resolved.Load())
}

// TestResolverError: a resolver that fails fails the dial UNAVAILABLE
// with its reason.
func TestResolverError(t *testing.T) {
	_, err := Dial(tctx(t), "x:1", WithResolver(func(context.Context) (string, error) {
		return "", errors.New("no leader elected")
	}))
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.ErrorContains(t, err, "no leader elected")
}
