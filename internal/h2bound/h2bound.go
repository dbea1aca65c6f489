package h2bound

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
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
	// WriteTimeout bounds each write to a client (0: none): a client that
	// stops reading fails the server's write, so the server closes the
	// connection and its bytes come back instead of waiting on it for
	// ever (and h2bound's own frames, written from the reader, never
	// wait on such a client longer than this).
	WriteTimeout time.Duration
}

// Bound counts the request bytes of the connections its listeners
// accept. Safe for concurrent use.
type Bound struct {
	cfg   Config
	mem   *budget.Budget
	mu    sync.Mutex // conns
	conns map[*conn]struct{}
	// stuck is the bytes held by incomplete requests on connections
	// whose reader waits for room.
	stuck   atomic.Int64
	refused atomic.Int64
	starved atomic.Int64 // connections closed for a window left shut
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

// Refused is the number of calls refused (REFUSED_STREAM) so far.
func (b *Bound) Refused() int64 { return b.refused.Load() }

// Starved is the number of connections closed so far because the client
// kept a flow-control window shut while answers waited on it for
// WriteTimeout.
func (b *Bound) Starved() int64 { return b.starved.Load() }

// SendWindows is the connection-level send window h2bound sees on each
// open connection: the client's WINDOW_UPDATEs for the connection less
// the server's DATA since 65,535 bytes. A live client opens it as it
// reads, so it stays positive between answers.
func (b *Bound) SendWindows() []int64 {
	b.mu.Lock()
	conns := make([]*conn, 0, len(b.conns))
	for c := range b.conns {
		conns = append(conns, c)
	}
	b.mu.Unlock()
	out := make([]int64, 0, len(conns))
	for _, c := range conns {
		c.mu.Lock()
		out = append(out, c.connWin)
		c.mu.Unlock()
	}
	return out
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
	return l.b.wrap(c), nil
}

// wrap counts c's requests.
func (b *Bound) wrap(c net.Conn) *conn {
	ctx, cancel := context.WithCancel(context.Background())
	bc := &conn{Conn: c, b: b, streams: map[uint32]*stream{}, ctx: ctx, cancel: cancel, pre: len(clientPreface),
		connWin: initialWindow, initWin: initialWindow}
	b.mu.Lock()
	b.conns[bc] = struct{}{}
	b.mu.Unlock()
	return bc
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
	charge int64     // bytes taken from the budget
	began  time.Time // first DATA
	whole  bool      // the client ended its side (END_STREAM)
	win    int64     // the server's send window on the call
	// Time the call's answer could not be sent for a shut window (its
	// own or the connection's): the total of past spells and the start
	// of the current one (zero: none). A total, not the current spell,
	// so that a client opening a byte at a time gains nothing.
	shutFor time.Duration
	shutAt  time.Time
}

type conn struct {
	net.Conn
	b *Bound

	mu      sync.Mutex // streams, closed, waiting
	streams map[uint32]*stream
	closed  bool
	waiting bool            // the reader waits for room
	ctx     context.Context // ends at Close
	cancel  context.CancelFunc
	once    sync.Once

	// The server's send windows (RFC 9113 §6.9), under mu: the client's
	// WINDOW_UPDATEs and SETTINGS_INITIAL_WINDOW_SIZE open them, the
	// server's DATA spends them. A client that keeps a window shut while
	// an open call waits on it is closed once that call has waited
	// WriteTimeout in all, as one that stops reading is: it reads (and
	// answers pings), so no write ever blocks, yet the calls' answers,
	// and their request bytes, would stay for ever.
	connWin  int64
	initWin  int64
	shut     int // open calls whose window (or the connection's) is shut
	starve   *time.Timer
	starveAt time.Time // when starve fires (zero: not armed)

	// Read's own state: the client's frames as they pass.
	pre   int    // preface bytes still to pass
	left  int    // payload bytes left in the current frame
	drop  bool   // the current frame's payload is dropped (a refused call's)
	cur   uint32 // the current DATA frame's stream (0: not DATA)
	curES bool   // the current DATA frame ends its stream
	ctl   byte   // the current frame's type when it is a WINDOW_UPDATE or SETTINGS read (ctlOn)
	ctlOn bool
	ctlID uint32  // its stream
	ctlB  [6]byte // its payload so far: a window increment, or one setting
	nctl  int
	carry []byte // input held back: an incomplete frame header, or (more) what follows a tail
	more  bool   // carry holds input to rewrite before reading more
	tail  []byte // frames to pass on at the next frame boundary (refused calls' CANCEL)
	buf   []byte // Read's own buffer, for small reads (nil until one)
	pend  []byte // output not yet returned
	rerr  error  // the read error to return once pend is empty

	wmu    sync.Mutex // out, queued, writes
	out    frames     // server to client
	queued []byte     // frames to the client waiting for a frame boundary
}

// HTTP/2 frames h2bound writes itself.
const (
	frameWindowUpdate = 0x8
	errCancel         = 0x8
	errRefusedStream  = 0x7
	readBuf           = 32 << 10
	minDirect         = 4 << 10 // smallest p Read rewrites in place
)

// appendFrame appends a frame with a 4-byte payload (RST_STREAM,
// WINDOW_UPDATE).
func appendFrame(b []byte, typ byte, sid uint32, payload uint32) []byte {
	b = append(b, 0, 0, 4, typ, 0)
	b = binary.BigEndian.AppendUint32(b, sid)
	return binary.BigEndian.AppendUint32(b, payload)
}

// Read passes on what the peer sent once its DATA bytes are counted
// (waiting for room, or refusing the call: see the package doc). It
// reads and rewrites in p itself when p is large enough (gRPC reads with
// its 32 KiB buffer), so a connection holds no buffer of its own; in a
// buffer of its own only for small reads, or input held back after a
// refusal that p cannot take.
func (c *conn) Read(p []byte) (int, error) {
	for len(c.pend) == 0 {
		if c.rerr != nil {
			return 0, c.rerr
		}
		b := p
		direct := len(p) >= minDirect && len(c.carry) <= len(p)/2
		if !direct {
			if len(c.buf) < len(c.carry)+minDirect {
				c.buf = make([]byte, max(readBuf, len(c.carry)+minDirect))
			}
			b = c.buf
		}
		k := copy(b, c.carry)
		c.carry = c.carry[:0]
		var n int
		var err error
		if c.more {
			c.more = false // rewrite it first: the client may have sent all
		} else {
			n, err = c.Conn.Read(b[k:])
		}
		w, inject, tail, rerr := c.rewrite(b[:k+n])
		if len(inject) > 0 {
			c.inject(inject)
		}
		if rerr != nil {
			c.Close()
			return 0, rerr
		}
		c.rerr = err
		if !direct {
			c.pend = append(b[:w], tail...)
			continue
		}
		c.pend = tail // after p[:w]
		if w > 0 {
			return w, nil
		}
	}
	n := copy(p, c.pend)
	c.pend = c.pend[n:]
	return n, nil
}

// rewrite walks b, the client's bytes, compacting in place what passes
// on (w bytes). It returns the frames to send the client, and those to
// pass on after b[:w]: a refused call's CANCEL, at the frame boundary
// after the frame that refused it (dropped); the input after that waits
// in carry.
func (c *conn) rewrite(b []byte) (w int, inject, tail []byte, err error) {
	var credit uint32 // dropped DATA bytes to credit back
	defer func() {
		if credit > 0 {
			inject = appendFrame(inject, frameWindowUpdate, 0, credit)
		}
		if tail == nil && len(c.tail) > 0 && c.pre == 0 && (c.left == 0 || c.drop) {
			tail, c.tail = c.tail, nil // b ends at a frame boundary
		}
	}()
	for r := 0; r < len(b); {
		if len(c.tail) > 0 && c.pre == 0 && c.left == 0 {
			// A frame boundary: the CANCEL goes here, what follows later.
			c.carry, c.more = append(c.carry, b[r:]...), true
			tail, c.tail = c.tail, nil
			return w, inject, tail, nil
		}
		switch {
		case c.pre > 0:
			n := min(c.pre, len(b)-r)
			w += copy(b[w:], b[r:r+n])
			r, c.pre = r+n, c.pre-n
			continue
		case c.left > 0:
			n := min(c.left, len(b)-r)
			if !c.drop {
				if c.ctlOn {
					c.control(b[r : r+n])
				}
				w += copy(b[w:], b[r:r+n])
			}
			r, c.left = r+n, c.left-n
			if c.left == 0 {
				c.frameDone()
			}
			continue
		}
		h := b[r:]
		if len(h) < 9 {
			c.carry = append(c.carry, h...)
			break
		}
		length, typ, flags, sid := header(h)
		c.cur, c.curES, c.drop, c.ctlOn = 0, false, false, false
		switch typ {
		case frameHeaders:
			c.mu.Lock()
			if _, ok := c.streams[sid]; !ok && !c.closed {
				s := &stream{whole: flags&flagEndStream != 0, win: c.initWin}
				c.streams[sid] = s
				c.watch(s)
			}
			c.mu.Unlock()
		case frameWindowUpdate, frameSettings:
			if typ == frameWindowUpdate || flags&flagAck == 0 {
				c.ctl, c.ctlOn, c.ctlID, c.nctl = typ, true, sid, 0
			}
		case frameRSTStream:
			c.release(sid) // the client cancelled the call
		case frameData:
			if length > 0 {
				ok, cerr := c.count(sid, int64(length))
				if cerr != nil {
					return 0, nil, nil, cerr
				}
				if !ok {
					// Refused: the frame is dropped, and the loop stops
					// at the boundary after it for the CANCEL.
					inject = appendFrame(inject, frameRSTStream, sid, errRefusedStream)
					c.tail = appendFrame(c.tail, frameRSTStream, sid, errCancel)
					credit += uint32(length)
					r += 9
					c.left, c.drop = length, true
					continue
				}
			}
			c.cur, c.curES = sid, flags&flagEndStream != 0
		}
		w += copy(b[w:], h[:9])
		r += 9
		c.left = length
		if length == 0 {
			c.frameDone()
		}
	}
	return w, inject, tail, nil
}

// frameDone ends the current frame: a DATA frame with END_STREAM makes
// its request whole.
func (c *conn) frameDone() {
	if c.cur == 0 || !c.curES {
		return
	}
	c.mu.Lock()
	if s := c.streams[c.cur]; s != nil {
		s.whole = true
	}
	c.mu.Unlock()
}

// count takes n DATA bytes of call sid, and reports false when the call
// is refused instead. Bytes of a call not open (ended, refused or never
// opened) are not held by the server and pass uncounted.
//
// A reader waits for room only while what the connections whose readers
// wait hold of incomplete requests (its own included) leaves n for the
// rest to give back: complete requests end without any reader, and
// incomplete ones on connections still read complete, or stall and are
// closed by the sweep. So a wait never depends on bytes queued behind a
// waiting reader, its own included. A call that cannot wait, or has
// waited Stall, is refused: its bytes go back at once.
func (c *conn) count(sid uint32, n int64) (bool, error) {
	c.mu.Lock()
	if s := c.streams[sid]; s == nil || c.b.mem.TryAcquire(n) {
		if s != nil {
			c.charge(s, n)
		}
		c.mu.Unlock()
		return true, nil
	}
	// No room: wait, counted among the waiting readers with what this
	// connection holds of incomplete requests.
	var own int64
	for _, s := range c.streams {
		if !s.whole {
			own += s.charge
		}
	}
	c.waiting = true
	c.mu.Unlock()
	c.b.stuck.Add(own)
	since := time.Now()
	ok, err := c.waitRoom(n)
	c.b.stuck.Add(-own)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waiting = false
	for _, s := range c.streams {
		s.began = s.began.Add(time.Since(since)) // the client did not stall them meanwhile
	}
	switch {
	case err != nil:
		return false, err
	case !ok:
		if s := c.forget(sid); s != nil {
			c.b.mem.Release(s.charge)
		}
		c.b.refused.Add(1)
		return false, nil
	}
	if s := c.streams[sid]; s != nil && !c.closed {
		c.charge(s, n)
	} else {
		c.b.mem.Release(n)
	}
	return true, nil
}

// charge adds n bytes, taken from the budget, to s. c.mu is held.
func (c *conn) charge(s *stream, n int64) {
	if s.charge == 0 {
		s.began = time.Now()
	}
	s.charge += n
}

// waitRoom takes n bytes once they are free and waiting is safe (see
// count); false when it is not, or after Stall. Each time it looks (at
// least every 50 ms), the connections whose requests stalled are
// closed first.
func (c *conn) waitRoom(n int64) (bool, error) {
	deadline := time.Now().Add(c.b.cfg.Stall)
	for {
		now := time.Now()
		if c.b.sweep(now) > 0 && c.b.mem.TryAcquire(n) {
			return true, nil
		}
		if c.b.cfg.MaxBytes-c.b.stuck.Load() < n || !now.Before(deadline) {
			return false, nil
		}
		ctx, cancel := context.WithTimeout(c.ctx, min(deadline.Sub(now), 50*time.Millisecond))
		err := c.b.mem.Acquire(ctx, n)
		cancel()
		if err == nil {
			return true, nil
		}
		if c.ctx.Err() != nil {
			return false, net.ErrClosed
		}
	}
}

// inject sends frames to the client between the server's frames.
func (c *conn) inject(frames []byte) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if len(c.queued) == 0 && c.out.boundary() {
		c.write(frames) // a failure shows on the server's next write
		return
	}
	c.queued = append(c.queued, frames...)
}

// release forgets stream sid and gives its bytes back.
func (c *conn) release(sid uint32) {
	c.mu.Lock()
	s := c.forget(sid)
	c.mu.Unlock()
	if s != nil {
		c.b.mem.Release(s.charge)
	}
}

// forget removes stream sid and returns it (nil if not open). c.mu is
// held.
func (c *conn) forget(sid uint32) *stream {
	s := c.streams[sid]
	if s == nil {
		return nil
	}
	delete(c.streams, sid)
	if !s.shutAt.IsZero() {
		c.shut--
	}
	return s
}

// control reads p, payload bytes of the client's WINDOW_UPDATE or
// SETTINGS, into the send windows.
func (c *conn) control(p []byte) {
	for _, x := range p {
		if !c.ctlOn {
			return // a WINDOW_UPDATE's 4 bytes are read; the rest is the server's error to find
		}
		c.ctlB[c.nctl] = x
		c.nctl++
		switch {
		case c.ctl == frameWindowUpdate && c.nctl == 4:
			c.ctlOn = false
			c.opened(c.ctlID, int64(binary.BigEndian.Uint32(c.ctlB[:4])&0x7fffffff))
		case c.ctl == frameSettings && c.nctl == 6:
			c.nctl = 0
			if binary.BigEndian.Uint16(c.ctlB[:2]) == settingInitialWindowSize {
				c.setInitial(int64(binary.BigEndian.Uint32(c.ctlB[2:6])))
			}
		}
	}
}

// opened applies a WINDOW_UPDATE of n to stream sid's window, or the
// connection's (sid 0).
func (c *conn) opened(sid uint32, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if sid == 0 {
		c.moveConnWin(n)
	} else if s := c.streams[sid]; s != nil {
		s.win += n
		c.watch(s)
	}
}

// setInitial applies a new SETTINGS_INITIAL_WINDOW_SIZE: every open
// call's window moves by the difference (RFC 9113 §6.9.2).
func (c *conn) setInitial(v int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := v - c.initWin
	c.initWin = v
	for _, s := range c.streams {
		s.win += d
		c.watch(s)
	}
}

// spent applies n bytes of the server's DATA on stream sid.
func (c *conn) spent(sid uint32, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.streams[sid]; s != nil {
		s.win -= n
		c.watch(s)
	}
	c.moveConnWin(-n)
}

// moveConnWin moves the connection's window by d: every open call is
// shut while it is. c.mu is held.
func (c *conn) moveConnWin(d int64) {
	was := c.connWin <= 0
	c.connWin += d
	if was != (c.connWin <= 0) {
		for _, s := range c.streams {
			c.watch(s)
		}
	}
}

// watch starts or stops s's clock as its answer can or cannot be sent,
// and arms the timer for the time it would reach WriteTimeout. c.mu is
// held.
func (c *conn) watch(s *stream) {
	wt := c.b.cfg.WriteTimeout
	shut := s.win <= 0 || c.connWin <= 0
	switch {
	case wt <= 0 || c.closed || shut == !s.shutAt.IsZero():
	case shut:
		now := time.Now()
		s.shutAt = now
		c.shut++
		c.armStarve(now.Add(wt - s.shutFor))
	default:
		s.shutFor += time.Since(s.shutAt)
		s.shutAt = time.Time{}
		c.shut--
	}
}

// armStarve makes the timer fire at t at the latest. c.mu is held.
func (c *conn) armStarve(t time.Time) {
	if !c.starveAt.IsZero() && !t.Before(c.starveAt) {
		return
	}
	c.starveAt = t
	if c.starve == nil {
		c.starve = time.AfterFunc(time.Until(t), c.starved)
	} else {
		c.starve.Reset(time.Until(t))
	}
}

// starved closes the connection if a call's answer has waited on shut
// windows for WriteTimeout in all, or arms the timer for the next call
// that may.
func (c *conn) starved() {
	c.mu.Lock()
	c.starveAt = time.Time{}
	if c.closed || c.shut == 0 {
		c.mu.Unlock()
		return
	}
	wt, now := c.b.cfg.WriteTimeout, time.Now()
	var next time.Time
	for _, s := range c.streams {
		if s.shutAt.IsZero() {
			continue
		}
		left := wt - s.shutFor - now.Sub(s.shutAt)
		if left <= 0 {
			c.mu.Unlock()
			c.b.starved.Add(1)
			c.Close()
			return
		}
		if t := now.Add(left); next.IsZero() || t.Before(next) {
			next = t
		}
	}
	c.armStarve(next)
	c.mu.Unlock()
}

func (c *conn) stalled(now time.Time, stall time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.waiting {
		return false // the reader, not the client, stopped its requests
	}
	for _, s := range c.streams {
		if s.charge > 0 && !s.whole && now.Sub(s.began) > stall {
			return true
		}
	}
	return false
}

// Write ends a call's count when the server ends the call: its trailers
// (HEADERS with END_STREAM) or RST_STREAM. Frames h2bound queued for the
// client follow at the first frame boundary.
func (c *conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for q := p; len(q) > 0; {
		adv, ev := c.out.step(q)
		q = q[adv:]
		switch {
		case ev.kind != evHeader:
		case ev.typ == frameRSTStream || ev.typ == frameHeaders && ev.flags&flagEndStream != 0:
			c.release(ev.sid)
		case ev.typ == frameData && ev.length > 0:
			c.spent(ev.sid, int64(ev.length))
		}
	}
	n, err := c.write(p)
	if err == nil && len(c.queued) > 0 && c.out.boundary() {
		_, err = c.write(c.queued)
		c.queued = c.queued[:0]
	}
	return n, err
}

// write writes p to the client within WriteTimeout, and closes the
// connection when it cannot: gRPC's server stops writing after an error
// but leaves the connection to its reader, which a client that stopped
// reading yet keeps its side open never ends. c.wmu is held.
func (c *conn) write(p []byte) (int, error) {
	wt := c.b.cfg.WriteTimeout
	if wt > 0 {
		c.Conn.SetWriteDeadline(time.Now().Add(wt))
	}
	n, err := c.Conn.Write(p)
	if err != nil && wt > 0 {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			c.Close()
		}
	}
	return n, err
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
		c.shut, c.starveAt = 0, time.Time{}
		if c.starve != nil {
			c.starve.Stop()
		}
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
