package h2bound

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/crescent-kv/crescent/internal/budget"
)

// Config sets a Bound's limits.
type Config struct {
	// MaxBytes bounds the request bytes held at once across connections:
	// DATA received on a call that has not ended.
	MaxBytes int64
	// Stall bounds how long a reader waits for room, and how long a
	// request begun (its first DATA in) may stay incomplete while another
	// reader waits: its connection is then closed.
	Stall time.Duration
}

// ErrStalled is a read that found no room within Config.Stall.
var ErrStalled = errors.New("h2bound: no room for request bytes within the stall timeout")

// Bound counts the request bytes of the connections its listeners
// accept. Safe for concurrent use.
type Bound struct {
	cfg   Config
	mem   *budget.Budget
	mu    sync.Mutex // conns
	conns map[*conn]struct{}
}

// New returns a Bound; MaxBytes and Stall must be positive.
func New(cfg Config) *Bound {
	return &Bound{cfg: cfg, mem: budget.New(cfg.MaxBytes), conns: map[*conn]struct{}{}}
}

// Held is the request bytes held now.
func (b *Bound) Held() int64 {
	used, _, _ := b.mem.State()
	return used
}

// Peak is the most request bytes ever held at once.
func (b *Bound) Peak() int64 {
	_, peak, _ := b.mem.State()
	return peak
}

// Listener wraps l: every connection it accepts is counted.
func (b *Bound) Listener(l net.Listener) net.Listener { return &listener{Listener: l, b: b} }

type listener struct {
	net.Listener
	b *Bound
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	bc := &conn{Conn: c, b: l.b, streams: map[uint32]*stream{}, ctx: ctx, cancel: cancel, in: frames{preface: len(clientPreface)}}
	l.b.mu.Lock()
	l.b.conns[bc] = struct{}{}
	l.b.mu.Unlock()
	return bc, nil
}

// sweep closes the connections holding a request begun more than Stall
// ago and still incomplete (a reader waits for room they hold) and
// returns how many.
func (b *Bound) sweep(now time.Time) int {
	b.mu.Lock()
	var stale []*conn
	for c := range b.conns {
		if c.stalled(now, b.cfg.Stall) {
			stale = append(stale, c)
		}
	}
	b.mu.Unlock()
	for _, c := range stale {
		c.Close()
	}
	return len(stale)
}

// stream is one call's request bytes.
type stream struct {
	charge int64
	began  time.Time // first DATA
	whole  bool      // the client ended its side (END_STREAM)
}

type conn struct {
	net.Conn
	b *Bound

	mu      sync.Mutex // streams, closed
	streams map[uint32]*stream
	closed  bool
	ctx     context.Context // ends at Close
	cancel  context.CancelFunc
	once    sync.Once

	in  frames     // client to server, Read's only
	wmu sync.Mutex // out
	out frames     // server to client
}

// Read passes on what the peer sent once its DATA bytes are counted,
// waiting for room when there is none.
func (c *conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		if aerr := c.scanIn(p[:n]); aerr != nil {
			c.Close()
			return 0, aerr
		}
	}
	return n, err
}

func (c *conn) scanIn(p []byte) error {
	for len(p) > 0 {
		adv, ev := c.in.step(p)
		p = p[adv:]
		if ev.kind == evNone {
			continue
		}
		switch {
		case ev.kind == evHeader && ev.typ == frameHeaders:
			c.mu.Lock()
			if _, ok := c.streams[ev.sid]; !ok && !c.closed {
				c.streams[ev.sid] = &stream{whole: ev.flags&flagEndStream != 0}
			}
			c.mu.Unlock()
		case ev.typ == frameData:
			if ev.n > 0 {
				if err := c.charge(ev.sid, int64(ev.n)); err != nil {
					return err
				}
			}
			if ev.end && ev.flags&flagEndStream != 0 {
				c.mu.Lock()
				if s := c.streams[ev.sid]; s != nil {
					s.whole = true
				}
				c.mu.Unlock()
			}
		case ev.typ == frameRSTStream && ev.end:
			c.release(ev.sid) // the client cancelled the call
		}
	}
	return nil
}

// charge counts n DATA bytes of stream sid, waiting for room. Bytes of a
// stream not open (ended, or never opened) are not held by the server.
func (c *conn) charge(sid uint32, n int64) error {
	c.mu.Lock()
	_, open := c.streams[sid]
	c.mu.Unlock()
	if !open {
		return nil
	}
	if !c.b.mem.TryAcquire(n) {
		if err := c.wait(n); err != nil {
			return err
		}
	}
	c.mu.Lock()
	s := c.streams[sid]
	if s == nil || c.closed {
		c.mu.Unlock()
		c.b.mem.Release(n)
		return nil
	}
	if s.charge == 0 {
		s.began = time.Now()
	}
	s.charge += n
	c.mu.Unlock()
	return nil
}

// wait takes n bytes once they are free, within Stall. Each second of it
// (and at its start) the connections whose requests stalled are closed.
func (c *conn) wait(n int64) error {
	deadline := time.Now().Add(c.b.cfg.Stall)
	for {
		now := time.Now()
		if c.b.sweep(now) > 0 && c.b.mem.TryAcquire(n) {
			return nil
		}
		if !now.Before(deadline) {
			return ErrStalled
		}
		ctx, cancel := context.WithTimeout(c.ctx, min(deadline.Sub(now), time.Second))
		err := c.b.mem.Acquire(ctx, n)
		cancel()
		switch {
		case err == nil:
			return nil
		case c.ctx.Err() != nil:
			return net.ErrClosed
		}
	}
}

// release forgets stream sid and gives its bytes back.
func (c *conn) release(sid uint32) {
	c.mu.Lock()
	s := c.streams[sid]
	delete(c.streams, sid)
	c.mu.Unlock()
	if s != nil {
		c.b.mem.Release(s.charge)
	}
}

func (c *conn) stalled(now time.Time, stall time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.streams {
		if s.charge > 0 && !s.whole && now.Sub(s.began) > stall {
			return true
		}
	}
	return false
}

// Write ends a call's count when the server ends the call: its trailers
// (HEADERS with END_STREAM) or RST_STREAM.
func (c *conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	for q := p; len(q) > 0; {
		adv, ev := c.out.step(q)
		q = q[adv:]
		if ev.kind == evHeader && (ev.typ == frameRSTStream || ev.typ == frameHeaders && ev.flags&flagEndStream != 0) {
			c.release(ev.sid)
		}
	}
	c.wmu.Unlock()
	return c.Conn.Write(p)
}

// Close gives back every byte the connection holds.
func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.mu.Lock()
		c.closed = true
		var n int64
		for _, s := range c.streams {
			n += s.charge
		}
		clear(c.streams)
		c.mu.Unlock()
		c.b.mu.Lock()
		delete(c.b.conns, c)
		c.b.mu.Unlock()
		c.cancel()
		c.b.mem.Release(n)
	})
	return err
}

// NetConn is the wrapped connection.
func (c *conn) NetConn() net.Conn { return c.Conn }
