package crpc

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"

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
	sp := &splitter{lis: lis}
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
	c.SetReadDeadline(time.Now().Add(prefaceTimeout))
	_, err := io.ReadFull(c, head[:])
	sp.mu.Lock()
	delete(sp.routing, c)
	sp.mu.Unlock()
	if err != nil {
		return
	}
	c.SetReadDeadline(time.Time{})
	to := sp.other
	if string(head[:]) == magic {
		to = sp.crpc
	} else {
		// gRPC multiplexes calls on long-lived connections: never evicted
		// as idle.
		c.Busy()
	}
	pc := &peekedConn{Conn: c, nc: c, head: append([]byte(nil), head[:]...), closed: make(chan struct{})}
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
	net.Conn
	nc     *netx.Conn
	head   []byte
	once   sync.Once
	closed chan struct{}
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
	err := c.Conn.Close()
	c.once.Do(func() { close(c.closed) })
	return err
}

// Busy and Idle mark the connection for the port's netx caps.
func (c *peekedConn) Busy() { c.nc.Busy() }
func (c *peekedConn) Idle() { c.nc.Idle() }
