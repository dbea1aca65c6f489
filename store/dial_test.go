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
	"github.com/crescent-kv/crescent/internal/grpctune"
	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
	"github.com/crescent-kv/crescent/store/rpcerr"
	"github.com/crescent-kv/crescent/store/storepb"
)

// TestDialMasterAutoAfterMasterStarts: "auto" dialled while the master is
// down does not settle on gRPC: once a real master comes up on the
// address, calls go over crpc.
func TestDialMasterAutoAfterMasterStarts(t *testing.T) {
	addr := testsvc.FreeAddr(t) // the master is down

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

	lis, err := net.Listen("tcp", addr)
	require.NoError(t, err)
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

// TestDialMasterTuned: "grpc_tuned" against a master served with
// grpctune.ServerOptions carries the service over gRPC (not crpc), its
// pooled codec round-trips replies and store errors, and a Client works
// over it end to end.
func TestDialMasterTuned(t *testing.T) {
	m, err := master.New(master.Config{})
	require.NoError(t, err)
	require.NoError(t, m.Start())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var grpcCalls atomic.Int64
	sctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	opts := append(grpctune.ServerOptions(), grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		grpcCalls.Add(1)
		return h(ctx, req)
	}))
	go func() {
		served <- service.New(m, service.WithGracePeriod(100*time.Millisecond)).Serve(sctx, lis, opts...)
	}()
	t.Cleanup(func() { // after the client's Close
		stop()
		assert.NoError(t, <-served)
		m.Close()
	})
	addr := lis.Addr().String()
	conn, proto, err := DialMaster(tctx(t), addr, "grpc_tuned", nil)
	require.NoError(t, err)
	defer conn.Close()
	assert.Equal(t, "grpc_tuned", proto)
	mc := storepb.NewMasterClient(conn)
	r, err := mc.ExistKey(tctx(t), &storepb.ExistKeyRequest{Key: "nope"})
	require.NoError(t, err)
	assert.False(t, r.Exists)
	_, err = mc.GetReplicaList(tctx(t), &storepb.GetReplicaListRequest{Key: "nope"})
	require.ErrorIs(t, rpcerr.FromStatus(err), errcode.ErrObjectNotFound, "the store code survives the codec")
	assert.EqualValues(t, 2, grpcCalls.Load())

	c := newTestClient(t, &testMaster{m: m, addr: addr}, 16<<20, func(c *Config) { c.MasterProtocol = "grpc_tuned" })
	assert.Equal(t, "grpc_tuned", c.MasterProtocol())
	v := testutil.Bytes(8<<10, 5)
	require.NoError(t, c.Put(tctx(t), "k", v, ReplicateConfig{}))
	got, err := c.Get(tctx(t), "k")
	require.NoError(t, err)
	assert.Equal(t, v, got)
}

// TestMasterDialer: Config.MasterDialer opens the master connection
// (with the client's interceptor) and names the protocol.
func TestMasterDialer(t *testing.T) {
	tm := startMaster(t, master.Config{})
	var dials, calls atomic.Int64
	c := newTestClient(t, tm, 0, func(c *Config) {
		c.MasterProtocol = "custom"
		c.MasterDialer = func(ctx context.Context, addr string, ic grpc.UnaryClientInterceptor) (MasterConn, error) {
			dials.Add(1)
			require.NotNil(t, ic)
			conn, _, err := DialMaster(ctx, addr, "grpc", func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				calls.Add(1)
				return ic(ctx, method, req, reply, cc, invoker, opts...)
			})
			return conn, err
		}
	})
	assert.Equal(t, "custom", c.MasterProtocol())
	ok, err := c.IsExist(tctx(t), "nope")
	require.NoError(t, err)
	assert.False(t, ok)
	assert.EqualValues(t, 1, dials.Load())
	assert.Positive(t, calls.Load())
}
