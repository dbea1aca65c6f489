// Package h2bound bounds the request bytes an HTTP/2 server (the master's
// gRPC server) holds across its connections, as crpc's MaxBufferedBytes
// does for crpc. gRPC reads each request whole before its handler runs and
// has no such bound of its own: without one, what its peers can make it
// hold is calls in flight times the largest message.
//
// A Bound's listener wraps each connection. Reads follow the client's
// frames (the 24-byte preface, then 9-byte headers: length 24 bits, type,
// flags, stream id 31 bits; RFC 9113 §4.1) without copying them: a
// HEADERS frame opens a call, and each DATA payload of an open call is
// counted before Read returns it (against an internal/budget, crpc's
// semaphore), waiting while the Bound is full. Writes
// follow the server's frames: the call's trailers (HEADERS with
// END_STREAM) or an RST_STREAM, either way, end the call and give its
// bytes back; so does the client's RST_STREAM, and closing the
// connection gives back all of its calls'. DATA of a call not open is
// not counted (the server drops it).
//
// A reader waits at most Config.Stall for room. While it waits, any
// connection holding a request that began (its first DATA) more than
// Stall ago and is still incomplete is closed: the bytes it holds go back,
// so requests stalled half-way cannot hold the room for ever. A reader
// that still finds no room fails its connection with ErrStalled.
//
// h2bound owns no wire format; it reads HTTP/2's framing.
package h2bound
