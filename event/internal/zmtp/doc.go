// Package zmtp is the socket layer under package event: ZeroMQ endpoints,
// the ZMTP 3.0 handshake (done by github.com/go-zeromq/zmq4), frame
// reading and writing, and a PUB fan-out with one bounded queue per
// subscriber.
//
// It exists because zmq4's own PUB socket leaks its writer goroutine on
// Close, shares one queue between all subscribers (one stalled reader
// stalls everyone), drops at its high-water mark without telling anyone,
// and reads each frame with several unbuffered syscalls. Here every peer
// has its own queue and writer goroutine, drops are counted, queued
// messages are coalesced into one writev, and reads are buffered.
//
// # Bounds on what a peer sends
//
// Nothing a peer announces is allocated before it arrives. ReadMsg checks
// each frame header against Limits (MaxMessage bytes summed over the
// frames of one message, default 64 MiB; MaxFrames, default 16) and
// fails with ErrLimit before reading the body; a body is read into a
// buffer that starts at 4 KiB and doubles only when the bytes received
// have filled it, so memory follows what was sent (at most about twice),
// never the size announced. Commands after the handshake (PING, ...) are
// at most MaxCommand (512) bytes, each a single frame, and are skipped
// without buffering. The handshake itself (greeting and READY) may send
// at most 64 KiB: zmq4 allocates a frame's announced size up front, so
// its reader is handed a frame header only once the size fits.
//
// A Pub reads from its peers only subscriptions: one-frame messages of 1
// (subscribe) or 0 (cancel) and a topic of at most MaxTopic bytes
// (default 256), at most MaxSubscriptions (default 1024) live per peer.
// Anything else ends that peer's connection.
//
// # Listeners
//
// Pub.Serve and Serve accept through internal/netx (backoff on EMFILE and
// other transient errors, connection caps with idle eviction). A Pub's
// peer is idle for eviction until it subscribes; a Server's handler marks
// each request with Conn.Busy and Conn.Idle.
package zmtp
