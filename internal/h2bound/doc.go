// Package h2bound bounds the request bytes an HTTP/2 server (the master's
// gRPC server) holds across its connections, as crpc's MaxBufferedBytes
// does for crpc. gRPC reads each request whole before its handler runs and
// has no such bound of its own: without one, what its peers can make it
// hold is calls in flight times the largest message.
//
// A Bound's listener wraps each connection. Reads follow the client's
// frames (the 24-byte preface, then 9-byte headers: length 24 bits, type,
// flags, stream id 31 bits; RFC 9113 §4.1): a HEADERS frame opens a call,
// and each DATA frame of an open call is counted (its whole payload,
// padding included) against a budget (an internal/budget, crpc's
// semaphore) before it passes on. Read rewrites what it read in the
// caller's buffer (gRPC reads with 32 KiB; a buffer of its own only for
// reads under 4 KiB, or input held back after a refusal that the
// caller's buffer cannot take, so an idle connection holds none) and
// holds back an incomplete frame header, so it decides on whole headers. Writes follow the server's frames: the call's
// trailers (HEADERS with END_STREAM) or an RST_STREAM, either way, end
// the call and give its bytes back; so does the client's RST_STREAM, and
// closing the connection gives back all of its calls'. DATA of a call
// not open is not counted (the server drops it).
//
// Waiting or refusing. A client interleaves the DATA of its calls on one
// connection, so the rest of calls already begun may sit behind a frame
// that finds no room, and a reader that waited for room its own
// connection holds would wait for ever. A reader waits only while what
// the connections whose readers wait hold of incomplete requests (its
// own included) leaves the frame's size for the rest to give back
// (complete requests end without any reader; incomplete ones on
// connections still read complete, or stall and are closed as below).
// Otherwise, or after Config.Stall of waiting, the frame's call is
// refused, and its bytes go back: the server reads, in place of that
// frame (dropped), an RST_STREAM (CANCEL) from the client; h2bound
// writes the client, between the server's frames, an RST_STREAM
// (REFUSED_STREAM: not processed, a gRPC client's UNAVAILABLE, safe to
// retry) and a connection WINDOW_UPDATE for the dropped bytes, which the
// server never saw. The connection and its other calls go on; DATA of the
// refused call read later passes uncounted to a server that has closed
// the call and drops it.
//
// While a reader waits, any connection holding a request that began (its
// first DATA) more than Stall ago and is still incomplete is closed: the
// bytes it holds go back, so requests stalled half-way cannot hold the
// room for ever. A connection whose own reader waits is not closed so
// (the reader, not the client, stopped its requests), and the time its
// reader waited does not count toward its requests' age.
//
// Each write to the client, the server's and h2bound's own, must end
// within Config.WriteTimeout, else the connection is closed and its
// bytes go back: gRPC's server stops writing after an error but leaves
// the connection open until its reader fails, which never happens while
// a client that stopped reading keeps its side open.
//
// A client that keeps reading (and answering pings) but never opens its
// flow-control window again blocks no write, so the write timeout never
// fires, yet the answers waiting on that window never leave and their
// calls' request bytes stay held. h2bound therefore keeps the server's
// send windows (RFC 9113 §6.9): the connection's and each open call's
// start at 65,535 bytes (a call's at the client's latest
// SETTINGS_INITIAL_WINDOW_SIZE, id 0x4, which also moves every open
// call's window by its change), grow by the client's WINDOW_UPDATEs
// (type 0x8, 4-byte increment, stream 0 for the connection) and shrink by
// the server's DATA (payload and padding). A call waits while a window
// it needs is spent (its own, or the connection's); once one call has
// waited Config.WriteTimeout in all (the sum of its waits, so a client
// opening a byte at a time gains nothing), the connection is closed and
// its bytes go back (Bound.Starved counts these). Waits of different
// calls are not added up: a long-lived connection whose calls each wait
// briefly stays. A live client opens its windows as it reads, whatever
// the application does with a unary answer.
//
// h2bound owns no wire format; it reads HTTP/2's framing and writes two
// of its frames (RST_STREAM: 9-byte header, type 0x3, error code 4
// bytes; WINDOW_UPDATE: type 0x8, stream 0, increment 4 bytes).
package h2bound
