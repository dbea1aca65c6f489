package service

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/internal/grpctune"
	"github.com/crescent-kv/crescent/store/rpcerr"
)

// maxGRPCHeaderBytes bounds one gRPC call's header block (gRPC's own
// default, 16 MiB, would be held for the call's life): our clients send
// a deadline, a credential and a user agent.
const maxGRPCHeaderBytes = 64 << 10

// grpcBounds are the gRPC server's bounds on what peers may hold open,
// the same as crpc's (ServerConfig.MaxCallsPerConn and MaxCalls): a
// connection may have perConn calls open (HTTP/2's
// SETTINGS_MAX_CONCURRENT_STREAMS; a stream past it is refused), and
// calls past total across connections are answered RESOURCE_EXHAUSTED
// before their request is read. A gRPC call is counted from its headers
// (its handler's goroutine exists from then on), not from its whole
// request as in crpc, so the bound cannot wait: it refuses.
func grpcBounds(cfg crpc.ServerConfig) ([]grpc.ServerOption, *callBound) {
	perConn, total := cfg.CallBounds()
	b := &callBound{max: int64(total)}
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(uint32(perConn)),
		grpc.MaxHeaderListSize(maxGRPCHeaderBytes),
		grpc.InTapHandle(b.tap),
		// A request's expansion bounded while it decodes, as crpc's.
		grpc.ForceServerCodecV2(grpctune.RequestCodec()),
	}, b
}

// callBound counts gRPC calls open across connections.
type callBound struct {
	n       atomic.Int64
	max     int64
	refused atomic.Int64 // calls answered RESOURCE_EXHAUSTED
}

// tap runs on a connection's reader as a call's headers arrive; ctx is
// the call's context, which gRPC cancels whenever the call ends.
func (b *callBound) tap(ctx context.Context, _ *tap.Info) (context.Context, error) {
	if b.n.Add(1) > b.max {
		b.n.Add(-1)
		b.refused.Add(1)
		return nil, status.Errorf(codes.ResourceExhausted, "the master has %d %s: retry later", b.max, rpcerr.CallsBound)
	}
	context.AfterFunc(ctx, func() { b.n.Add(-1) })
	return ctx, nil
}
