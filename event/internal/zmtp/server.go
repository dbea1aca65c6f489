package zmtp

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Server accepts peers of a given socket type and runs a handler per
// connection until Close.
type Server struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ln     net.Listener
}

// Serve starts serving ln: each peer that completes the handshake as typ
// gets handle(ctx, conn) in its own goroutine; the connection is closed
// when handle returns or the server closes.
func Serve(ln net.Listener, typ zmq4.SocketType, timeout time.Duration, handle func(context.Context, *Conn)) *Server {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{ctx: ctx, cancel: cancel, ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		acceptLoop(ctx, ln, &s.wg, func(raw net.Conn) {
			stop := make(chan struct{})
			defer close(stop)
			go closeOnDone(ctx, raw, stop)
			c, err := Handshake(raw, typ, true, timeout)
			if err != nil {
				_ = raw.Close()
				return
			}
			defer c.Close()
			handle(ctx, c)
		})
	}()
	return s
}

// Close stops the server, closes its connections and waits for handlers.
func (s *Server) Close() error {
	s.cancel()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

// DialConn connects to e and handshakes as typ, within ctx.
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
	go closeOnDone(ctx, raw, stop)
	c, err := Handshake(raw, typ, false, timeout)
	close(stop)
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
