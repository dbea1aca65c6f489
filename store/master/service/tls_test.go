package service

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/internal/testpki"
	"github.com/crescent-kv/crescent/store/master/internal/mastertest"
	"github.com/crescent-kv/crescent/store/storepb"
)

// TestServeTLS: with WithCRPC's TLS the master's one port is TLS for
// gRPC and crpc alike (mTLS: client certificates required), and both
// are counted by the one interceptor; plaintext clients are refused.
func TestServeTLS(t *testing.T) {
	pki := testpki.New(t)
	e := mastertest.New(t, nil)
	svc := New(e.M, WithCRPC(crpc.ServerConfig{TLS: pki.ServerTLS()}, netx.Config{}))
	addr := serveBoth(t, svc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	gc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientTLS(true))))
	require.NoError(t, err)
	defer gc.Close()
	cc, err := crpc.Dial(ctx, addr, crpc.WithTLS(pki.ClientTLS(true)))
	require.NoError(t, err)
	defer cc.Close()
	for _, c := range []storepb.MasterClient{storepb.NewMasterClient(gc), storepb.NewMasterClient(cc)} {
		_, err := c.ServiceReady(ctx, &storepb.ServiceReadyRequest{})
		require.NoError(t, err)
	}
	for _, rc := range svc.Counts() {
		if rc.Name == "service_ready" {
			require.EqualValues(t, 2, rc.Requests)
		}
	}

	_, err = crpc.Dial(ctx, addr)
	require.ErrorIs(t, err, crpc.ErrTLSRequired)
	pc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer pc.Close()
	sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
	defer scancel()
	_, err = storepb.NewMasterClient(pc).ServiceReady(sctx, &storepb.ServiceReadyRequest{})
	require.Error(t, err)
}
