package store

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
	"github.com/crescent-kv/crescent/store/storepb"
)

// TestDialMasterAutoAfterMasterStarts: "auto" dialled while the master is
// down does not settle on gRPC: once a real master comes up on the
// address, calls go over crpc.
func TestDialMasterAutoAfterMasterStarts(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close()) // the master is down

	var clientSeen atomic.Int64
	conn, proto, err := DialMaster(tctx(t), addr, "auto", func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		clientSeen.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	require.NoError(t, err)
	defer conn.Close()
	assert.Equal(t, "auto", proto)
	mc := storepb.NewMasterClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, err = mc.ServiceReady(ctx, &storepb.ServiceReadyRequest{})
	cancel()
	require.Error(t, err, "no master yet")

	lis, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port %s taken meanwhile: %v", addr, err)
	}
	m, err := master.New(master.Config{})
	require.NoError(t, err)
	require.NoError(t, m.Start())
	var grpcCalls, crpcCalls atomic.Int64
	count := func(n *atomic.Int64) grpc.UnaryServerInterceptor {
		return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			n.Add(1)
			return h(ctx, req)
		}
	}
	sctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- service.New(m, service.WithGracePeriod(100*time.Millisecond),
			service.WithCRPC(crpc.ServerConfig{Interceptor: count(&crpcCalls)}, netx.Config{})).
			Serve(sctx, lis, grpc.UnaryInterceptor(count(&grpcCalls)))
	}()
	defer func() {
		conn.Close()
		stop()
		assert.NoError(t, <-served)
		m.Close()
	}()

	for range 3 {
		_, err := mc.ServiceReady(tctx(t), &storepb.ServiceReadyRequest{})
		require.NoError(t, err)
	}
	assert.Equal(t, int64(3), crpcCalls.Load())
	assert.Zero(t, grpcCalls.Load(), "settled on gRPC")
	assert.Equal(t, "crpc", conn.(interface{ Protocol() string }).Protocol())
	assert.Equal(t, int64(4), clientSeen.Load(), "the interceptor sees every call, the failed one too")
}
