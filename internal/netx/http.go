package netx

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"time"
)

// Caps of an HTTP port (admin, metrics, HTTP metadata) unless its
// owner sets others.
const (
	DefaultHTTPMaxConns        = 1024
	DefaultHTTPMaxConnsPerHost = 256
)

// NewHTTPServer is an http.Server for h with the limits every Crescent
// HTTP port has: a request's header within 10 s and 64 KiB, the whole
// request within 60 s, its response written within 60 s of its header
// (a handler that streams longer sets its own deadlines through
// http.ResponseController), and a keep-alive connection closed after 2
// minutes without a request (the zero IdleTimeout would keep it for
// ever). Without the write timeout a peer that stops reading holds its
// handler, and what the handler is writing, for ever.
func NewHTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 60 * time.Second,
		WriteTimeout: httpWriteTimeout, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
}

// httpWriteTimeout is NewHTTPServer's write timeout (a variable so the
// tests need not wait a minute).
var httpWriteTimeout = 60 * time.Second

// HTTP is an http.Server served through a Loop, so an HTTP port has the
// same accept loop, caps, eviction of idle connections and Allow as the
// other listeners: http.Server's own loop has no connection cap, and a
// keep-alive connection without IdleTimeout is held forever.
type HTTP struct {
	loop   *Loop
	srv    *http.Server
	ln     *connListener
	served chan struct{}
	err    error // Serve's, read after served is closed
}

// ServeHTTP serves srv on ln through a Loop with cfg, with TLS when tlsCfg
// is set. A connection is busy (not evicted) from the moment a request
// starts until its response is written (http.ConnState Active to Idle);
// srv.ConnState, when set, is still called. Stop it with Shutdown or
// Close, not with srv's methods alone (they leave the Loop running).
func ServeHTTP(ln net.Listener, cfg Config, srv *http.Server, tlsCfg *tls.Config) *HTTP {
	cl := &connListener{addr: ln.Addr(), conns: make(chan net.Conn), closed: make(chan struct{})}
	h := &HTTP{srv: srv, ln: cl, served: make(chan struct{})}
	user := srv.ConnState
	srv.ConnState = func(c net.Conn, s http.ConnState) {
		if hc := httpConnOf(c); hc != nil {
			switch s {
			case http.StateActive:
				hc.Busy()
			case http.StateIdle:
				hc.Idle()
			}
		}
		if user != nil {
			user(c, s)
		}
	}
	h.loop = Serve(ln, cfg, func(c *Conn) {
		hc := &httpConn{Conn: c, gone: make(chan struct{})}
		select {
		case cl.conns <- hc:
		case <-cl.closed:
			return
		case <-c.l.ctx.Done():
			return
		}
		// The server owns the connection until it closes it; the Loop
		// counts it until then (or until the Loop is closed).
		select {
		case <-hc.gone:
		case <-c.l.ctx.Done():
		}
	})
	var l net.Listener = cl
	if tlsCfg != nil {
		l = tls.NewListener(cl, tlsCfg)
	}
	go func() {
		// An accept error the Loop cannot survive ends Serve with it.
		<-h.loop.Done()
		cl.close(h.loop.Err())
	}()
	go func() {
		defer close(h.served)
		h.err = srv.Serve(l)
	}()
	return h
}

// Addr is the listener's address.
func (h *HTTP) Addr() net.Addr { return h.loop.Addr() }

// Loop is the accept loop (for its counts).
func (h *HTTP) Loop() *Loop { return h.loop }

// Served is closed when srv.Serve has returned; Err is then its error.
func (h *HTTP) Served() <-chan struct{} { return h.served }

// Err is what srv.Serve returned (http.ErrServerClosed after Shutdown or
// Close), valid once Served is closed.
func (h *HTTP) Err() error {
	<-h.served
	return h.err
}

// Shutdown stops accepting and waits, within ctx, for requests in flight
// (http.Server.Shutdown), then closes what is left and the Loop.
func (h *HTTP) Shutdown(ctx context.Context) error {
	err := h.srv.Shutdown(ctx)
	h.loop.Close()
	<-h.served
	return err
}

// Close stops at once, dropping open connections.
func (h *HTTP) Close() error {
	err := h.srv.Close()
	h.loop.Close()
	<-h.served
	return err
}

// connListener hands the Loop's admitted connections to http.Server.
type connListener struct {
	addr   net.Addr
	conns  chan net.Conn
	once   sync.Once
	closed chan struct{}
	err    error // set before closed is closed
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		if l.err != nil {
			return nil, l.err
		}
		return nil, net.ErrClosed
	}
}

func (l *connListener) close(err error) {
	l.once.Do(func() {
		l.err = err
		close(l.closed)
	})
}

func (l *connListener) Close() error {
	l.close(nil)
	return nil
}

func (l *connListener) Addr() net.Addr { return l.addr }

// httpConn tells its Loop's handler when the server closed it.
type httpConn struct {
	*Conn
	once sync.Once
	gone chan struct{}
}

func (c *httpConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.gone) })
	return err
}

// httpConnOf finds the httpConn under what the server was given (a
// *tls.Conn wraps it).
func httpConnOf(c net.Conn) *httpConn {
	for {
		switch v := c.(type) {
		case *httpConn:
			return v
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil
		}
	}
}
