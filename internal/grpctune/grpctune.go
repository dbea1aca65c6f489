// Package grpctune is tuned gRPC for the store master's RPCs, in one
// place for the clients (store's "grpc_tuned"), the master
// (crescent-master --grpc_tuned) and the bench: fixed flow-control
// windows (4 MiB per stream, 16 MiB per connection: no BDP probing),
// 64 KiB read and write buffers, shared write buffers, handlers on a
// worker pool of GOMAXPROCS, keepalive both ways (clients ping after
// 10 s without traffic, the server allows pings every 5 s and pings
// idle clients after 30 s), and a protobuf codec that takes every
// marshal buffer from gRPC's pool. Wire format: gRPC's.
package grpctune

import (
	"fmt"
	"runtime"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	gproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/crescent-kv/crescent/internal/pbcodec"
)

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

// DialOptions are the client options of tuned gRPC (store's
// "grpc_tuned" adds them to its plain ones).
func DialOptions() []grpc.DialOption {
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

// ServerOptions are the master's gRPC server options for tuned clients
// (crescent-master --grpc_tuned, and the bench's in-process master);
// plain gRPC clients are served by them too.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.StaticStreamWindowSize(tunedStreamWindow),
		grpc.StaticConnWindowSize(tunedConnWindow),
		grpc.ReadBufferSize(tunedBuffer),
		grpc.WriteBufferSize(tunedBuffer),
		grpc.SharedWriteBuffer(true),
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: tunedPingEvery / 2, PermitWithoutStream: true}),
		grpc.ForceServerCodecV2(pooledCodec{request: true}),
	}
}

// pooledCodec is gRPC's proto codec with every marshal buffer from the
// pool (the default allocates those under 1 KiB: all the master's
// metadata messages). A server's (request) decodes what peers send with
// pbcodec.UnmarshalRequest, which bounds what a request may expand to.
type pooledCodec struct{ request bool }

func (pooledCodec) Name() string { return "proto" }

func (pooledCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("grpctune: marshal %T: not a protobuf message", v)
	}
	size := pbcodec.Size(m)
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	if _, err := pbcodec.AppendSized((*buf)[:0], m, size); err != nil {
		pool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

func (c pooledCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("grpctune: unmarshal %T: not a protobuf message", v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	if c.request {
		return pbcodec.UnmarshalRequest(buf.ReadOnlyData(), m) // copies what it keeps
	}
	return pbcodec.Unmarshal(buf.ReadOnlyData(), m)
}

// RequestCodec is a server codec for servers not tuned: gRPC's own
// proto codec, except that requests are decoded with
// pbcodec.UnmarshalRequest (a request's expansion bounded).
func RequestCodec() encoding.CodecV2 {
	return requestCodec{encoding.GetCodecV2(gproto.Name)}
}

type requestCodec struct{ encoding.CodecV2 }

// Unmarshal decodes as the tuned server does.
func (requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return pooledCodec{request: true}.Unmarshal(data, v)
}
