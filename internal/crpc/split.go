package crpc

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/crescent-kv/crescent/internal/netx"
)

// Split shares one listening socket between crpc and another protocol
// (gRPC): each accepted connection goes to crpcL when its first four
// bytes are crpc's magic, else to otherL, with those bytes still to be
// read. Clients of both speak first, so nothing waits. A connection that
// sends nothing within the preface timeout is closed. lis is served by
// netx.Serve with cfg (transient accept errors back off; cfg's caps count
// the connections of both protocols). Closing both returned listeners
// closes lis; connections already handed on live until their server
// closes them.
func Split(lis net.Listener, cfg netx.Config) (crpcL, otherL net.Listener) {
	return SplitTLS(lis, cfg, nil)
}

// SplitTLS is Split inside TLS when tc is not nil: each connection's
// handshake (within the preface timeout) comes first, then the split by
// the first bytes inside TLS, so gRPC-over-TLS and crpc-over-TLS share
// the port. Both returned listeners hand out connections already
// handshaken: serve gRPC on otherL with Credentials (not TLS credentials),
// and crpc with or without ServerConfig.TLS (it does not handshake
// again). tc's NextProtos get "h2" and "crpc" (ALPN) when missing. A
// plaintext crpc client is told the port requires TLS.
func SplitTLS(lis net.Listener, cfg netx.Config, tc *tls.Config) (crpcL, otherL net.Listener) {
	return split(lis, cfg, tc, nil)
}

func split(lis net.Listener, cfg netx.Config, tc *tls.Config, token []byte) (crpcL, otherL net.Listener) {
	sp := &splitter{lis: lis, token: token}
	if tc != nil {
		tc = tc.Clone()
		for _, p := range []string{"h2", alpn} {
			if !slices.Contains(tc.NextProtos, p) {
				tc.NextProtos = append(tc.NextProtos, p)
			}
		}
		if get := tc.GetConfigForClient; get != nil {
			// A per-handshake config (certificate reload) offers the
			// same protocols.
			protos := tc.NextProtos
			tc.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
				c, err := get(h)
				if c != nil {
					c = c.Clone()
					c.NextProtos = protos
				}
				return c, err
			}
		}
		sp.tls = tc
	}
	sp.crpc = &subListener{sp: sp, ch: make(chan net.Conn), done: make(chan struct{})}
	sp.other = &subListener{sp: sp, ch: make(chan net.Conn), done: make(chan struct{})}
	sp.open = 2
	sp.routing = map[*netx.Conn]bool{}
	if cfg.Name == "" {
		cfg.Name = "rpc port"
	}
	sp.loop = netx.Serve(lis, cfg, sp.route)
	sp.wg.Add(1)
	go func() {
		defer sp.wg.Done()
		<-sp.loop.Done()
		// The socket failed (or was closed): both listeners end.
		sp.crpc.end()
		sp.other.end()
	}()
	return sp.crpc, sp.other
}

type splitter struct {
	lis         net.Listener
	tls         *tls.Config // nil: plaintext
	token       []byte      // nil: no challenge
	loop        *netx.Loop
	crpc, other *subListener
	mu          sync.Mutex
	open        int
	routing     map[*netx.Conn]bool // connections not yet introduced
	wg          sync.WaitGroup
}

// route reads a connection's first bytes, hands it on and waits until
// its server closes it (netx closes a connection when its handler
// returns).
func (sp *splitter) route(c *netx.Conn) {
	sp.mu.Lock()
	if sp.open == 0 {
		sp.mu.Unlock()
		return
	}
	sp.routing[c] = true
	sp.mu.Unlock()
	var head [4]byte
	var stream net.Conn = c
	ok := true
	if sp.tls != nil {
		var tc *tls.Conn
		if tc, ok = handshake(c, sp.tls); ok {
			stream = tc
		}
	}
	var err error
	if ok {
		stream.SetReadDeadline(time.Now().Add(prefaceTimeout))
		_, err = io.ReadFull(stream, head[:])
		if err == nil && sp.token != nil {
			if ok = authenticate(stream, head, sp.token); ok {
				stream.SetReadDeadline(time.Now().Add(prefaceTimeout))
				_, err = io.ReadFull(stream, head[:])
			}
		}
	}
	sp.mu.Lock()
	delete(sp.routing, c)
	sp.mu.Unlock()
	if !ok || err != nil {
		return
	}
	stream.SetReadDeadline(time.Time{})
	to := sp.other
	if string(head[:]) == magic {
		to = sp.crpc
	} else {
		// gRPC multiplexes calls on long-lived connections: never evicted
		// as idle.
		c.Busy()
	}
	pc := &peekedConn{Conn: stream, nc: c, secure: sp.tls != nil, head: append([]byte(nil), head[:]...), closed: make(chan struct{})}
	select {
	case to.ch <- pc:
	case <-to.done:
		return
	}
	<-pc.closed
}

type subListener struct {
	sp   *splitter
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func (l *subListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		if err := l.sp.loop.Err(); err != nil {
			return nil, err
		}
		return nil, net.ErrClosed
	}
}

// end stops Accept (the listener closed, or the socket failed).
func (l *subListener) end() bool {
	ended := false
	l.once.Do(func() {
		close(l.done)
		ended = true
	})
	return ended
}

func (l *subListener) Close() error {
	if !l.end() {
		return nil
	}
	l.sp.mu.Lock()
	l.sp.open--
	last := l.sp.open == 0
	if last {
		for c := range l.sp.routing {
			c.Close()
		}
	}
	l.sp.mu.Unlock()
	if !last {
		return nil
	}
	// Stop accepting now; the loop's Shutdown waits for the connections
	// handed on, which their servers close in their own time.
	err := l.sp.lis.Close()
	l.sp.wg.Add(1)
	go func() {
		defer l.sp.wg.Done()
		l.sp.loop.Shutdown(true)
	}()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

func (l *subListener) Addr() net.Addr { return l.sp.lis.Addr() }

// peekedConn replays the bytes Split read before handing it on.
type peekedConn struct {
	net.Conn            // nc, or TLS over it
	nc       *netx.Conn // the accepted connection
	secure   bool       // Conn is TLS, handshaken
	head     []byte
	once     sync.Once
	closed   chan struct{}
}

func (c *peekedConn) Read(p []byte) (int, error) {
	if len(c.head) > 0 {
		n := copy(p, c.head)
		c.head = c.head[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

func (c *peekedConn) Close() error {
	err := c.nc.Close() // first: TLS's close alert must not wait on the peer
	c.Conn.Close()
	c.once.Do(func() { close(c.closed) })
	return err
}

// Busy and Idle mark the connection for the port's netx caps.
func (c *peekedConn) Busy() { c.nc.Busy() }
func (c *peekedConn) Idle() { c.nc.Idle() }

// Credentials are the gRPC server credentials for SplitTLS's otherL: the
// handshake is done already, so they only report its TLS state to the
// handlers (peer.Peer's AuthInfo is a credentials.TLSInfo, as with
// credentials.NewTLS). A connection from a plaintext Split has no
// AuthInfo.
func Credentials() credentials.TransportCredentials { return splitCreds{} }

type splitCreds struct{}

func (splitCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("crpc: split credentials are server-side only")
}

func (splitCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	pc, ok := c.(*peekedConn)
	for u := c; !ok; { // under wrappers that count its bytes (h2bound)
		w, isW := u.(interface{ NetConn() net.Conn })
		if !isW {
			break
		}
		u = w.NetConn()
		pc, ok = u.(*peekedConn)
	}
	if !ok || !pc.secure {
		return c, nil, nil
	}
	tc := pc.Conn.(*tls.Conn)
	return c, credentials.TLSInfo{State: tc.ConnectionState(), CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}, nil
}

func (splitCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls", SecurityVersion: "1.2"}
}

func (s splitCreds) Clone() credentials.TransportCredentials { return s }

func (splitCreds) OverrideServerName(string) error { return nil }
