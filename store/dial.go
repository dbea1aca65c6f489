package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/store/rpcerr"
)

// MasterConn is a connection to a master, gRPC or crpc, for
// storepb.NewMasterClient.
type MasterConn interface {
	grpc.ClientConnInterface
	io.Closer
}

// DialMaster connects to the master at addr as clients do: proto is
// "crpc", "grpc", "grpc_tuned" (gRPC with TunedGRPCDialOptions; the
// master should serve with TunedGRPCServerOptions), or "auto" (or empty):
// crpc when the master answers it, else gRPC. It returns the connection and the protocol used; intercept,
// when not nil, sees every call. With "auto" and a master that does not
// answer yet, the protocol is "auto": each call tries crpc again until
// the master answers, and the connection's Protocol method says which
// one it then settled on.
func DialMaster(ctx context.Context, addr, proto string, intercept grpc.UnaryClientInterceptor) (MasterConn, string, error) {
	switch proto {
	case "", "auto", "crpc", "grpc", "grpc_tuned":
	default:
		return nil, "", fmt.Errorf("%w: master protocol %q (want auto, crpc, grpc or grpc_tuned)", ErrInvalidConfig, proto)
	}
	if proto == "grpc" || proto == "grpc_tuned" {
		var extra []grpc.DialOption
		if proto == "grpc_tuned" {
			extra = TunedGRPCDialOptions()
		}
		conn, err := dialGRPC(addr, intercept, extra...)
		if err != nil {
			return nil, "", err
		}
		return conn, proto, nil
	}
	var opts []crpc.Option
	if intercept != nil {
		opts = append(opts, crpc.WithUnaryInterceptor(intercept))
	}
	cc, err := crpc.Dial(ctx, addr, opts...)
	switch {
	case err == nil:
		return cc, "crpc", nil
	case proto == "crpc":
		return nil, "", fmt.Errorf("store: master %s: %w", addr, rpcerr.FromStatus(err))
	case errors.Is(err, crpc.ErrNotCRPC):
		conn, err := dialGRPC(addr, intercept)
		if err != nil {
			return nil, "", err
		}
		return conn, "grpc", nil
	}
	// Not reachable yet: decide when it is, not for the client's life.
	g, err := dialGRPC(addr, nil) // refuses a malformed address now
	if err != nil {
		return nil, "", err
	}
	g.Close()
	return &autoConn{addr: addr, intercept: intercept, sem: make(chan struct{}, 1)}, "auto", nil
}

// Tuned gRPC: fixed flow-control windows (no BDP probing), larger
// socket buffers, keepalive both ways, handlers on a worker pool, and a
// codec that takes every marshal buffer from gRPC's pool.
const (
	tunedStreamWindow = 4 << 20
	tunedConnWindow   = 16 << 20
	tunedBuffer       = 64 << 10
	tunedPingEvery    = 10 * time.Second // client; the server permits 5 s
	tunedPingTimeout  = 5 * time.Second
)

// TunedGRPCDialOptions are the client options of "grpc_tuned" (added to
// the plain gRPC ones: insecure transport, 256 MiB messages).
func TunedGRPCDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithStaticStreamWindowSize(tunedStreamWindow),
		grpc.WithStaticConnWindowSize(tunedConnWindow),
		grpc.WithReadBufferSize(tunedBuffer),
		grpc.WithWriteBufferSize(tunedBuffer),
		grpc.WithSharedWriteBuffer(true),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: tunedPingEvery, Timeout: tunedPingTimeout, PermitWithoutStream: true}),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(pooledCodec{})),
	}
}

// TunedGRPCServerOptions are the master's gRPC server options for
// "grpc_tuned" clients (crescent-master --grpc_tuned, and the bench's
// in-process master). Plain gRPC clients are served by them too.
func TunedGRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.StaticStreamWindowSize(tunedStreamWindow),
		grpc.StaticConnWindowSize(tunedConnWindow),
		grpc.ReadBufferSize(tunedBuffer),
		grpc.WriteBufferSize(tunedBuffer),
		grpc.SharedWriteBuffer(true),
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: tunedPingEvery / 2, PermitWithoutStream: true}),
		grpc.ForceServerCodecV2(pooledCodec{}),
	}
}

// pooledCodec is gRPC's proto codec with every marshal buffer from the
// pool (the default allocates those under 1 KiB: all the master's
// metadata messages).
type pooledCodec struct{}

func (pooledCodec) Name() string { return "proto" }

func (pooledCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("store: marshal %T: not a protobuf message", v)
	}
	size := proto.Size(m)
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	if _, err := (proto.MarshalOptions{UseCachedSize: true}).MarshalAppend((*buf)[:0], m); err != nil {
		pool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

func (pooledCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("store: unmarshal %T: not a protobuf message", v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m) // copies what it keeps
}

func dialGRPC(addr string, intercept grpc.UnaryClientInterceptor, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// Batch answers for many keys exceed gRPC's 4 MiB default.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20), grpc.MaxCallSendMsgSize(256<<20)),
	}, extra...)
	if intercept != nil {
		opts = append(opts, grpc.WithUnaryInterceptor(intercept))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: master address %q: %w", ErrInvalidConfig, addr, err)
	}
	return conn, nil
}

// autoConn is "auto" against a master not reachable at dial time: each
// call dials crpc first; a master that answers crpc settles it on crpc
// (whose Conn redials by itself), one that answers otherwise on gRPC.
type autoConn struct {
	addr      string
	intercept grpc.UnaryClientInterceptor
	sem       chan struct{} // one dial at a time; waiters keep their deadline

	mu     sync.Mutex
	conn   MasterConn // nil until settled
	proto  string
	closed bool
}

// Protocol is "crpc" or "grpc" once settled, else "auto".
func (a *autoConn) Protocol() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn == nil {
		return "auto"
	}
	return a.proto
}

func (a *autoConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	invoke := func(ctx context.Context, method string, args, reply any, _ *grpc.ClientConn, opts ...grpc.CallOption) error {
		c, err := a.get(ctx)
		if err != nil {
			return err
		}
		return c.Invoke(ctx, method, args, reply, opts...)
	}
	if a.intercept != nil {
		return a.intercept(ctx, method, args, reply, nil, invoke, opts...)
	}
	return invoke(ctx, method, args, reply, nil, opts...)
}

func (a *autoConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	c, err := a.get(ctx)
	if err != nil {
		return nil, err
	}
	return c.NewStream(ctx, desc, method, opts...)
}

// get returns the settled connection, or tries to settle it.
func (a *autoConn) get(ctx context.Context) (MasterConn, error) {
	if c, err := a.settled(); c != nil || err != nil {
		return c, err
	}
	select {
	case a.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	defer func() { <-a.sem }()
	if c, err := a.settled(); c != nil || err != nil {
		return c, err
	}
	var conn MasterConn
	proto := "crpc"
	cc, err := crpc.Dial(ctx, a.addr)
	switch {
	case err == nil:
		conn = cc
	case errors.Is(err, crpc.ErrNotCRPC):
		if conn, err = dialGRPC(a.addr, nil); err != nil {
			return nil, err
		}
		proto = "grpc"
	default:
		return nil, err // still unreachable: the next call tries again
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		conn.Close()
		return nil, status.Error(codes.Canceled, "store: master connection closed")
	}
	a.conn, a.proto = conn, proto
	return conn, nil
}

func (a *autoConn) settled() (MasterConn, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, status.Error(codes.Canceled, "store: master connection closed")
	}
	return a.conn, nil
}

func (a *autoConn) Close() error {
	a.mu.Lock()
	a.closed = true
	c := a.conn
	a.mu.Unlock()
	if c != nil {
		return c.Close()
	}
	return nil
}
