package crpc

import (
	"io"
	"net"
	"sync"
	"time"
)

// Split shares one listening socket between crpc and another protocol
// (gRPC): each accepted connection goes to crpcL when its first four
// bytes are crpc's magic, else to otherL, with those bytes still to be
// read. Clients of both speak first, so nothing waits. A connection that
// sends nothing within the preface timeout is closed. Closing both
// returned listeners closes lis.
func Split(lis net.Listener) (crpcL, otherL net.Listener) {
	sp := &splitter{lis: lis}
	sp.crpc = &subListener{sp: sp, ch: make(chan net.Conn), done: make(chan struct{})}
	sp.other = &subListener{sp: sp, ch: make(chan net.Conn), done: make(chan struct{})}
	sp.open = 2
	sp.routing = map[net.Conn]bool{}
	sp.wg.Add(1)
	go sp.run()
	return sp.crpc, sp.other
}

type splitter struct {
	lis         net.Listener
	crpc, other *subListener
	mu          sync.Mutex
	open        int
	err         error             // the accept error that ended run
	routing     map[net.Conn]bool // connections not yet introduced
	wg          sync.WaitGroup    // run and route goroutines
}

func (sp *splitter) run() {
	defer sp.wg.Done()
	for {
		c, err := sp.lis.Accept()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			sp.mu.Lock()
			if sp.open > 0 {
				sp.err = err
			}
			sp.mu.Unlock()
			sp.crpc.end()
			sp.other.end()
			sp.lis.Close()
			return
		}
		sp.mu.Lock()
		if sp.open == 0 {
			sp.mu.Unlock()
			c.Close()
			continue
		}
		sp.routing[c] = true
		sp.wg.Add(1)
		sp.mu.Unlock()
		go sp.route(c)
	}
}

func (sp *splitter) route(c net.Conn) {
	defer sp.wg.Done()
	var head [4]byte
	c.SetReadDeadline(time.Now().Add(prefaceTimeout))
	_, err := io.ReadFull(c, head[:])
	sp.mu.Lock()
	delete(sp.routing, c)
	sp.mu.Unlock()
	if err != nil {
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	to := sp.other
	if string(head[:]) == magic {
		to = sp.crpc
	}
	pc := &peekedConn{Conn: c, head: append([]byte(nil), head[:]...)}
	select {
	case to.ch <- pc:
	case <-to.done:
		c.Close()
	}
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
		l.sp.mu.Lock()
		err := l.sp.err
		l.sp.mu.Unlock()
		if err == nil {
			err = net.ErrClosed
		}
		return nil, err
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
	if l.end() {
		l.sp.mu.Lock()
		l.sp.open--
		last := l.sp.open == 0
		l.sp.mu.Unlock()
		if last {
			err := l.sp.lis.Close()
			l.sp.mu.Lock()
			for c := range l.sp.routing {
				c.Close()
			}
			l.sp.mu.Unlock()
			l.sp.wg.Wait()
			return err
		}
	}
	return nil
}

func (l *subListener) Addr() net.Addr { return l.sp.lis.Addr() }

// peekedConn replays the bytes Split read before handing it on.
type peekedConn struct {
	net.Conn
	head []byte
}

func (c *peekedConn) Read(p []byte) (int, error) {
	if len(c.head) > 0 {
		n := copy(p, c.head)
		c.head = c.head[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
