// Package netx is the project's one accept loop. Every listener (the
// master's RPC port, the engine's TCP data port and handshake server, the
// shm server, the ZMQ publisher, and the HTTP ports through ServeHTTP)
// serves through Serve so that they share one behaviour:
//
//   - transient accept errors (EMFILE, ENFILE, ENOBUFS, ENOMEM,
//     ECONNABORTED, timeouts) back off (5 ms doubling to 1 s) and the loop
//     keeps serving, so running out of fds never ends a server;
//   - a cap on live connections per listener (MaxConns) and per remote IP
//     (MaxConnsPerHost). At a cap the loop first closes the connection that
//     has been idle longest in that scope (a connection is idle until its
//     handler calls Conn.Busy, and again after Conn.Idle, unless bytes it
//     received wait to be read), so idle sockets
//     cannot starve peers that have work (with IdleGrace, only one idle
//     that long counts, so a connection just accepted is not taken for a
//     squatter before its handler reads). If none is idle, the global cap
//     stops accepting until a slot frees or a connection goes idle
//     (Conn.Idle wakes a loop held there; the kernel backlog queues new
//     peers; when an idle connection was passed over only for unread
//     bytes, it looks again every 5 ms) and the per-host cap refuses the
//     new connection;
//   - Allow, when set, turns peers away by address before any handler
//     runs (the protected default admits loopback peers only); refusals
//     are counted and logged at most once per 10 s;
//   - Close stops accepting, closes the listener and every live
//     connection, and waits for the handlers to return.
//
// ServeHTTP runs an http.Server on a Loop: the Loop accepts and admits,
// then hands each connection to the server through a listener of its own
// (with TLS when asked) and counts it until the server closes it. The
// server's connection states mark it: Active is Busy, Idle is Idle.
// NewHTTPServer gives the timeouts every HTTP port has (header 10 s and
// 64 KiB, request 60 s, response 60 s, keep-alive idle 2 min).
//
// netx owns no wire format.
package netx
