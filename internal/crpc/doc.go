// Package crpc is a light unary RPC for the store master: the same
// protobuf services and generated code as gRPC, over a plain framed TCP
// stream. A gRPC unary call on loopback costs about 58 µs and several
// goroutine hand-offs on each side (HTTP/2 framing, HPACK, the loopy
// writer); a crpc call is one write and one read on each side. The
// master's metadata RPCs are small and latency-bound, so this is where a
// put or get of a small value spends its time.
//
// The server side is a grpc.ServiceRegistrar: generated Register*Server
// functions register the same implementation on it as on a grpc.Server,
// and Split serves both protocols on one listening port by the first
// bytes of each connection. The client side, Conn, is a
// grpc.ClientConnInterface for generated New*Client constructors. Errors
// are gRPC statuses (with their details) on both sides, so callers cannot
// tell the two transports apart. Only unary methods are served.
//
// # Wire format (version 1)
//
// All integers are little-endian.
//
//	preface   client -> server: "CRPC" u8 version u8[3] zero
//	          server -> client: the same 8 bytes with the server's version
//	frame     u32 length  (of what follows the 9-byte header, at most MaxFrame)
//	          u32 call id (chosen by the client, echoed by the server)
//	          u8  kind
//	kind 1    request:  u8 method-name length, method name ("/pkg.Service/Method"),
//	          the request message (protobuf)
//	kind 2    reply:    the response message (protobuf)
//	kind 3    error:    a google.rpc.Status (protobuf): code, message, details
//
// A client may have many calls in flight on one connection; replies come
// in any order. A malformed frame closes the connection; an unknown
// method is answered with UNIMPLEMENTED. A connection that breaks fails
// its calls in flight with UNAVAILABLE, and the next call dials again.
// Deadlines are not sent: the caller's context bounds the wait, the
// server's handler context ends when the connection closes. A call that
// times out with nothing at all received since it was sent breaks the
// connection, so a server gone without a FIN is dialled again at the next
// call instead of after TCP's timeouts.
package crpc
