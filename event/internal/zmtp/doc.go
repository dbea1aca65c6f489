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
package zmtp
