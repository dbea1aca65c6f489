// Package drpcx serves and calls the store master's gRPC services over
// storj.io/drpc, for measuring drpc against gRPC and crpc (crescent-bench
// --master_protocol drpc, crescent-bench rpc). It is imported only by
// bench and cmd/crescent-bench: dropping drpc is deleting this package.
//
// No generated drpc code: Register adapts a grpc.ServiceDesc (its unary
// methods) to a drpc.Description, so the generated gRPC handlers, and the
// one grpc.UnaryServerInterceptor chain the master uses for gRPC and crpc,
// serve drpc too, and nothing has to be regenerated when the proto
// changes. The request is kept as bytes by drpc and decoded once by the
// gRPC handler.
//
// # Wire format
//
// drpc's own (drpcwire packets), one call at a time per connection; the
// RPC name is the gRPC full method ("/pkg.Service/Method"), messages are
// protobuf. A failure travels as a drpc error whose code is the gRPC code
// and whose message is a marshalled google.rpc.Status (code, message,
// details), so callers get the same gRPC status, details included, as
// over gRPC or crpc.
//
// # Behaviour and bounds
//
//   - Conn (a grpc.ClientConnInterface) keeps a pool of connections, one
//     call in flight on each, at most MaxConns (64); a call beyond waits
//     for one within its context. A broken connection is dropped and the
//     next call dials again. Streams are not supported.
//   - A message is bounded either way by MaxMessage (256 MiB).
//   - The server accepts through netx.Serve (backoff on transient errors,
//     connection caps) and serves each connection's calls in turn.
//   - Deadlines are not propagated to the handler (drpc carries none);
//     a caller's cancel closes its connection, which ends the handler's
//     context.
package drpcx
