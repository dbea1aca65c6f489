package crpc

import (
	"context"
	"crypto/tls"
	"errors"
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
	"github.com/crescent-kv/crescent/internal/testpki"
)

// TestTLS: crpc.Serve with ServerConfig.TLS serves a client with a
// certificate, and refuses one without (mTLS), a plaintext client
// (ErrTLSRequired, said by the server) and a client that does not trust
// the server.
func TestTLS(t *testing.T) {
	pki := testpki.New(t)
	lis := listen(t)
	serveOn(t, lis, ServerConfig{TLS: pki.ServerTLS()})
	addr := lis.Addr().String()
	ctx := tctx(t)

	c := dial(t, addr, WithTLS(pki.ClientTLS(true)))
	got, err := call(ctx, c, "Echo", "sealed")
	require.NoError(t, err)
	require.Equal(t, "echo:sealed", got)
	// Errors keep their details inside TLS too.
	_, err = call(ctx, c, "Fail", "x")
	require.Equal(t, codes.FailedPrecondition, status.Code(err))

	_, err = Dial(ctx, addr)
	require.ErrorIs(t, err, ErrTLSRequired)

	// No client certificate: the server refuses the handshake.
	_, err = Dial(ctx, addr, WithTLS(pki.ClientTLS(false)))
	require.Error(t, err)
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.ErrorContains(t, err, "certificate required")

	// A client that does not trust the server's CA.
	_, err = Dial(ctx, addr, WithTLS(&tls.Config{Certificates: []tls.Certificate{pki.Client}}))
	require.ErrorContains(t, err, "TLS handshake")

	// TLS to a plaintext server fails clearly too.
	plain := listen(t)
	serveOn(t, plain)
	_, err = Dial(ctx, plain.Addr().String(), WithTLS(pki.ClientTLS(true)))
	require.ErrorContains(t, err, "TLS handshake")
}

// serveTLSGRPC serves the test service over gRPC on gl with the split's
// Credentials until the test ends; the value holds the common name of
// the last client certificate a handler saw.
func serveTLSGRPC(t *testing.T, gl net.Listener) *atomic.Value {
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
	t.Cleanup(func() { g.Stop(); <-gdone })
	return &seenCN
}

// TestSplitTLS: on one port, gRPC over TLS and crpc over TLS, both with
// client certificates; gRPC handlers see the client's certificate
// through Credentials; plaintext clients of either are refused.
func TestSplitTLS(t *testing.T) {
	pki := testpki.New(t)
	lis := listen(t)
	cl, gl := SplitTLS(lis, netx.Config{}, pki.ServerTLS())
	serveOn(t, cl, ServerConfig{TLS: pki.ServerTLS()}) // not handshaken twice
	seenCN := serveTLSGRPC(t, gl)
	ctx := tctx(t)
	addr := lis.Addr().String()

	// A silent peer does not hold the others up while it handshakes.
	raw, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer raw.Close()

	c := dial(t, addr, WithTLS(pki.ClientTLS(true)))
	got, err := call(ctx, c, "Echo", "c")
	require.NoError(t, err)
	require.Equal(t, "echo:c", got)

	gc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientTLS(true))))
	require.NoError(t, err)
	defer gc.Close()
	got, err = call(ctx, gc, "Echo", "g")
	require.NoError(t, err)
	require.Equal(t, "echo:g", got)
	require.Equal(t, testpki.ClientName, seenCN.Load())

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

// wrappedListener hands out its connections under a wrapper that shows
// the connection beneath through NetConn, as a byte counter does
// (internal/h2bound on the master's gRPC side).
type wrappedListener struct{ net.Listener }

type wrappedConn struct{ net.Conn }

func (c wrappedConn) NetConn() net.Conn { return c.Conn }

func (l wrappedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return wrappedConn{c}, nil
}

// TestSplitTLSUnderWrapper: gRPC handlers see the client's certificate
// through Credentials when the split's connection comes wrapped.
func TestSplitTLSUnderWrapper(t *testing.T) {
	pki := testpki.New(t)
	lis := listen(t)
	cl, gl := SplitTLS(lis, netx.Config{}, pki.ServerTLS())
	serveOn(t, cl, ServerConfig{TLS: pki.ServerTLS()})
	seenCN := serveTLSGRPC(t, wrappedListener{gl})
	gc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientTLS(true))))
	require.NoError(t, err)
	defer gc.Close()
	got, err := call(tctx(t), gc, "Echo", "g")
	require.NoError(t, err)
	require.Equal(t, "echo:g", got)
	require.Equal(t, testpki.ClientName, seenCN.Load())
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
