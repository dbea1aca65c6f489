package zmtp

import (
	"cmp"
	"context"
	"net"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/crescent-kv/crescent/internal/netx"
)

// ServerConfig configures Serve.
type ServerConfig struct {
	// Type is the socket type this side handshakes as.
	Type zmq4.SocketType
	// HandshakeTimeout bounds a new peer's handshake (default 5s).
	HandshakeTimeout time.Duration
	// Limits bound each message read from a peer.
	Limits Limits
	// Listener configures the netx loop (connection caps, name, logger).
	Listener netx.Config
}

// Server accepts peers of a given socket type and runs a handler per
// connection until Close.
type Server struct {
	ctx    context.Context
	cancel context.CancelFunc
	loop   *netx.Loop
}

// Serve starts serving ln through netx: each peer that completes the
// handshake gets handle(ctx, conn) in its own goroutine, with its reads
// bounded by cfg.Limits; the connection is closed when handle returns or
// the server closes. Handlers mark the span of each request with
// Conn.Busy and Conn.Idle.
func Serve(ln net.Listener, cfg ServerConfig, handle func(context.Context, *Conn)) *Server {
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 5 * time.Second
	}
	cfg.Listener.Name = cmp.Or(cfg.Listener.Name, "zmq "+string(cfg.Type))
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{ctx: ctx, cancel: cancel}
	// netx closes live connections on Close, which ends handshakes and
	// blocked reads.
	s.loop = netx.Serve(ln, cfg.Listener, func(raw *netx.Conn) {
		c, err := Handshake(raw, cfg.Type, true, cfg.HandshakeTimeout)
		if err != nil {
			return
		}
		c.SetLimits(cfg.Limits)
		handle(ctx, c)
	})
	return s
}

// Close stops the server, closes its connections and waits for handlers.
func (s *Server) Close() error {
	s.cancel()
	return s.loop.Close()
}

// DialConn connects to e and handshakes as typ, within ctx. Its reads
// take the default Limits until SetLimits.
func DialConn(ctx context.Context, e Endpoint, typ zmq4.SocketType) (*Conn, error) {
	raw, err := Dial(ctx, e)
	if err != nil {
		return nil, err
	}
	timeout := 5 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		closeOnDone(ctx, raw, stop)
	}()
	c, err := Handshake(raw, typ, false, timeout)
	close(stop)
	// Wait for the watcher to decide: a caller that cancels ctx once we
	// return (a dial timeout) must not find its connection closed.
	<-watched
	if err != nil {
		_ = raw.Close()
		return nil, err
	}
	if ctx.Err() != nil {
		_ = raw.Close()
		return nil, ctx.Err()
	}
	return c, nil
}
