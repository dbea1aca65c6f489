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
// ServerConfig.Interceptor is a grpc.UnaryServerInterceptor, so one chain
// (metrics, logging) serves a grpc.Server and a crpc Server alike.
//
// # Wire format (version 2)
//
// All integers are little-endian.
//
//	preface   client -> server: "CRPC" u8 version u8[3] zero
//	          server -> client: the same 8 bytes with the server's version;
//	          version 0xff (in plaintext, then close): this server
//	          speaks crpc only inside TLS
//	frame     u32 length  (of what follows the 9-byte header, at most MaxFrame)
//	          u32 call id (chosen by the client, echoed by the server)
//	          u8  kind
//	kind 1    request (client -> server):
//	          u64 timeout in microseconds (what was left of the caller's
//	              deadline when sent; 0: none)
//	          u8  method-name length (1..255), method name ("/pkg.Service/Method")
//	          the request message (protobuf)
//	kind 2    reply (server -> client): the response message (protobuf)
//	kind 3    error (server -> client): a google.rpc.Status (protobuf):
//	          code, message, details
//	kind 4    cancel (client -> server), empty: the caller of call id gave
//	          up; the server ends that handler's context and sends no answer
//	kind 5    ping (client -> server), empty, any id
//	kind 6    pong (server -> client), empty, the ping's id
//
// With TLS (ServerConfig.TLS, SplitTLS, WithTLS) the TLS handshake comes
// first (ALPN "crpc"; SplitTLS also offers "h2" for gRPC) and all of the
// above runs inside it.
//
// With the cluster token (SplitAuth on the server; WithToken on a crpc
// client, TokenCredentials on a gRPC one) every connection opens, after
// TLS if any and before anything else, with internal/auth's challenge
// (purpose auth.PurposeMasterRPC: "CRAU" hello, answer, proof, verdict;
// see internal/auth) and the split by preface follows it. A crpc client
// that sends its preface instead is answered with the preface of version
// 0xfe (this server needs the token) and closed (Dial: ErrTokenRequired);
// any other opening is closed unanswered. A failed challenge closes the
// connection before a frame is read.
//
// Version 1 had no kinds 4 to 6 and no timeout in requests; the server
// answers a preface of another version with its own and closes, and Dial
// reports both versions.
//
// # Behaviour and bounds
//
// A client may have many calls in flight on one connection; replies come
// in any order. A malformed frame (unknown kind, a body on a cancel, ping
// or pong, a body over MaxFrame, a request from the server) closes the
// connection; an unknown method is answered with UNIMPLEMENTED. A
// connection that breaks fails its calls in flight with UNAVAILABLE, and
// the next call dials again.
//
// Server (ServerConfig; zero values take the defaults):
//   - a frame's body buffer grows as its bytes arrive (from 64 KiB,
//     doubling, each step once more bytes are in), never to the declared
//     length up front; MaxFrame (DefaultMaxFrame, 64 MiB) bounds it;
//   - MaxBufferedBytes (1 GiB) bounds the request bytes held across
//     connections (bodies being read, requests not yet answered); each
//     growth step reserves its bytes first, and a reader that finds the
//     budget spent waits, within its frame deadline;
//   - once a header is in, the rest of its frame must arrive within
//     FrameTimeout (10 s), and a connection that sends no frame for
//     IdleTimeout (60 s) is closed; clients ping well within it;
//   - at most MaxCallsPerConn (256) calls run per connection and MaxCalls
//     (4096) in all: at either bound the server stops reading that
//     connection until a call has answered (a cancel or ping behind the
//     waiting request waits with it);
//   - a handler's context ends at the caller's deadline (the request's
//     timeout), at its cancel frame, or when the connection closes;
//   - each call runs on a goroutine of its own, unless ServerConfig.Inline
//     says it may run on its connection's reader: at small calls the
//     hand-off to a new goroutine (waking another thread on an idle
//     process) costs more than the handler. The connection reads on
//     when an inline call returns; a handler about to wait calls
//     Detach(ctx), which hands reading to a new goroutine, so only calls
//     that do not wait stay on the reader. An inline call that runs
//     longer than the client's ping timeout (5 s) without Detach loses
//     its connection, since the ping behind it is not read;
//   - every write has WriteTimeout (10 s): a peer that stops reading
//     loses its connection; replies (up to 64 KiB each) that are ready
//     while another is being written queue and go out together in the
//     next write, and each call's slots free once its reply is out;
//   - TLS: Serve with ServerConfig.TLS, or SplitTLS, handshakes each
//     connection within the preface timeout (10 s) before anything else,
//     and then splits by the first bytes inside TLS, so gRPC-over-TLS
//     (grpc.Creds(Credentials()) on the other listener: its handlers see
//     the client's certificate) and crpc-over-TLS share one port; mTLS is
//     the tls.Config's ClientAuth;
//   - Serve and Split accept through netx.Serve (backoff on EMFILE and
//     other transient errors; connection caps, idle connections evicted
//     first: a crpc connection is busy while it has calls in flight).
//
// Client (Dial options):
//   - a write honours the call's deadline: a call that cannot start its
//     write by then fails DEADLINE_EXCEEDED without touching the
//     connection; one cut off mid-frame returns DEADLINE_EXCEEDED at once
//     and the rest of its frame is sent in the background within the ping
//     timeout (else the connection breaks), so the calls behind it wait
//     only within their own deadlines;
//   - a call whose context ends sends a cancel frame;
//   - WithCallTimeout(d) bounds every call to d from its start (or its
//     context's earlier deadline) with no timer or context per call: the
//     deadline rides in the request's timeout as a context's would, and
//     a sweeper per connection (every d/20, 1-100 ms) ends calls past it
//     with DEADLINE_EXCEEDED, interrupts the reader, sends their cancel
//     frames and pings a server silent since. A reply that comes later
//     finds no call and is dropped;
//   - replies: there is no reader goroutine per connection. A caller
//     waiting for its reply that finds nobody reading takes the
//     connection's one read role and reads itself, delivering the other
//     calls' replies and the pongs it reads, until its own reply is in;
//     then a waiting caller takes the role on, and the caller that
//     hands it yields its core so the next reader runs at once rather
//     than after this caller's next request is out (not with
//     WithPollWait, whose callers sit on locked threads). One call in
//     flight involves no other goroutine (no hand-off to wake a cgo
//     caller's locked thread). A reader whose context ends is interrupted (a read
//     deadline in the past) and hands the role on; a frame it was in the
//     middle of is finished by the next reader;
//   - idle connections: a background reader takes the role once no
//     caller has read for 1 ms, and yields it to the next caller (which
//     claims it before writing its request; a reply that comes before the
//     background reader has woken to yield is handed over, as to a
//     follower), so a server that closes or dies (FIN or RST) while the
//     connection is idle is seen at once and the next call dials again,
//     NotSent-safe. The window left: for up to 1 ms (plus timer and
//     scheduling delay) after the last caller stopped reading nobody
//     reads, and a call made then on a connection the server has just
//     closed is written to it and fails UNAVAILABLE, not NotSent, like a
//     call in flight when the server goes;
//   - WithPollWait (off by default): a caller about to block on its
//     reply first waits up to the given time in ppoll on its own thread
//     (plain TCP only), so a cgo caller's locked thread is woken by the
//     kernel itself; Go callers lose by it, cgo callers gain;
//   - WithTLS: every (re)connection is a TLS client; against a TLS-only
//     server without it, Dial returns ErrTLSRequired;
//   - WithToken: every (re)connection proves the cluster token first;
//     WithDialer dials with a given net.Dialer (a local address);
//   - WithResolver: every (re)connection dials the address the resolver
//     gives then (a new leader after a failover), not Dial's;
//   - keepalive: a connection that has received nothing for the ping
//     interval (10 s), or whose call timed out with nothing received
//     since it was sent, is pinged; no pong within the ping timeout (5 s)
//     breaks it, so a server gone without a FIN is dialled again instead
//     of after TCP's timeouts.
package crpc
