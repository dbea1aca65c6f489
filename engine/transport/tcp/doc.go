// Package tcp is the TCP transport, wire-compatible with the reference
// engine's TCP transport (protocol version 2).
//
// # Wire format
//
// The target listens on tcp_data_port (published in its descriptor). Each
// request is a 24-byte header followed, for a WRITE, by the payload:
//
//	offset 0   u64 LE  size   bytes to move
//	offset 8   u64 LE  addr   target virtual address
//	offset 16  u8      opcode 0 READ, 1 WRITE; | 0x80 = version 2
//	offset 17  7 bytes padding (ignored)
//
// Version 2 adds 8-byte LE status words 0x4D435456_0000000s ("MCTV" in the
// high half, s = 0 OK, 1 rejected): for a READ before the data, for a
// WRITE after the payload has landed in target memory. A request whose
// range is not inside one registered buffer is rejected (status 1 for v2)
// and the connection closes (after a refused WRITE the server shuts its
// half and drops the payload, up to 64 MiB or 2 s, so the refusal is not
// lost to a reset). The server serves any number of requests per
// connection, in order, so it accepts both the reference's
// one-connection-per-transfer clients and pipelined ones. The client uses
// v2 when the target's descriptor says tcp_proto_version >= 2.
//
// With Config.Token set, each connection first runs the internal/auth
// challenge (PurposeTCPLane), lane by lane on the client, before the
// first header; the server closes a connection that fails before reading
// any header (Stats.AuthFailed). Config.Allow admits peers by address
// (the engine's protected default).
//
// The data port serves through internal/netx: accept errors such as
// EMFILE back off and retry; live connections are capped (MaxConns 4096,
// MaxConnsPerHost 1024). A connection counts as idle between requests,
// and at a cap the idlest one is closed to make room (its client's
// slices are retried on a new connection).
//
// # Client
//
// Each peer gets Lanes persistent connections; requests larger than
// SliceSize are cut into slices spread over the least-loaded lanes. A lane
// has a writer goroutine (headers batched into one write, WRITE header and
// payload in one writev straight from registered memory) and a reader
// goroutine matching status words and READ data to requests in FIFO order.
// Payloads are never copied in user space. When a connection breaks, its
// unanswered slices are sent again once on a new connection (Retries);
// slices past their deadline end with transport.ErrTimeout, and a
// rejected slice fails at once with transport.ErrRejected.
package tcp
