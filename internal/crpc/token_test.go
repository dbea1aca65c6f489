package crpc

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/internal/testpki"
)

func splitAuthServe(t *testing.T, tc *tls.Config, token []byte) string {
	t.Helper()
	lis := listen(t)
	cl, gl := SplitAuth(lis, netx.Config{}, tc, token)
	serveOn(t, cl)
	var gopts []grpc.ServerOption
	if tc != nil {
		gopts = append(gopts, grpc.Creds(Credentials()))
	}
	g := grpc.NewServer(gopts...)
	g.RegisterService(&testDesc, &testSvc{})
	gdone := make(chan struct{})
	go func() { g.Serve(gl); close(gdone) }()
	t.Cleanup(func() { g.Stop(); <-gdone })
	return lis.Addr().String()
}

// TestSplitAuth: with a cluster token, crpc and gRPC clients that prove
// it are served on one port; a crpc client without it is told why, one
// with a wrong token is refused, and a plaintext gRPC client or a raw
// peer sending frames gets nothing served.
func TestSplitAuth(t *testing.T) {
	tok := []byte("cluster-token-0123456789abcdef")
	addr := splitAuthServe(t, nil, tok)
	ctx := tctx(t)

	c := dial(t, addr, WithToken(tok))
	got, err := call(ctx, c, "Echo", "c")
	require.NoError(t, err)
	require.Equal(t, "echo:c", got)

	gc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(TokenCredentials(nil, tok)))
	require.NoError(t, err)
	defer gc.Close()
	got, err = call(ctx, gc, "Echo", "g")
	require.NoError(t, err)
	require.Equal(t, "echo:g", got)

	_, err = Dial(ctx, addr)
	require.ErrorIs(t, err, ErrTokenRequired)

	_, err = Dial(ctx, addr, WithToken([]byte("wrong-token-0123456789abcdef")))
	require.ErrorIs(t, err, auth.ErrRefused)

	pc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer pc.Close()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = call(sctx, pc, "Echo", "p")
	require.Error(t, err)

	// A peer that skips the challenge and sends a crpc preface and a
	// request frame gets the "token required" preface and nothing else.
	raw, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer raw.Close()
	_, err = raw.Write(append(preface(), make([]byte, 64)...))
	require.NoError(t, err)
	raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	n, _ := io.ReadFull(raw, buf)
	require.Equal(t, tokenRequiredPreface(), buf[:n])
}

// TestSplitAuthTLS: the challenge runs inside TLS.
func TestSplitAuthTLS(t *testing.T) {
	pki := testpki.New(t)
	tok := []byte("cluster-token-0123456789abcdef")
	addr := splitAuthServe(t, pki.ServerTLS(), tok)
	ctx := tctx(t)
	c := dial(t, addr, WithTLS(pki.ClientTLS(true)), WithToken(tok))
	got, err := call(ctx, c, "Echo", "c")
	require.NoError(t, err)
	require.Equal(t, "echo:c", got)
	gc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(TokenCredentials(credentials.NewTLS(pki.ClientTLS(true)), tok)))
	require.NoError(t, err)
	defer gc.Close()
	got, err = call(ctx, gc, "Echo", "g")
	require.NoError(t, err)
	require.Equal(t, "echo:g", got)
	_, err = Dial(ctx, addr, WithTLS(pki.ClientTLS(true)))
	require.ErrorIs(t, err, ErrTokenRequired)
}
