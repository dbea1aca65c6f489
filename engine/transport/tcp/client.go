package tcp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/internal/auth"
)

// job gathers the slices of one task.
type job struct {
	task      *transport.Task
	remaining atomic.Int32
	n         atomic.Int64
	err       atomic.Pointer[error]
}

// slice is one wire request.
type slice struct {
	j        *job
	op       transport.Op
	local    []byte
	remote   uint64
	deadline time.Time
	tries    int
}

func (s *slice) finish(err error) {
	if err != nil {
		s.j.err.CompareAndSwap(nil, &err)
	} else {
		s.j.n.Add(int64(len(s.local)))
	}
	if s.j.remaining.Add(-1) == 0 {
		var e error
		if p := s.j.err.Load(); p != nil {
			e = *p
		}
		s.j.task.Complete(int(s.j.n.Load()), e)
	}
}

// peer holds the lanes to one target.
type peer struct {
	t    *Transport
	addr string
	v2   bool

	mu     sync.Mutex
	lanes  []*lane
	closed error
	gen    atomic.Uint64 // lanes opened so far; numbers them
}

func newPeer(t *Transport, addr string, v2 bool) *peer {
	return &peer{t: t, addr: addr, v2: v2, lanes: make([]*lane, t.cfg.Lanes)}
}

func (p *peer) submit(tasks []*transport.Task) {
	size := p.t.cfg.SliceSize
	n := 0
	for _, tk := range tasks {
		n += (len(tk.Local) + size - 1) / size
	}
	jobs := make([]job, len(tasks))
	slices := make([]slice, 0, n)
	for i, tk := range tasks {
		j := &jobs[i]
		j.task = tk
		k := (len(tk.Local) + size - 1) / size
		j.remaining.Store(int32(k))
		for off := 0; off < len(tk.Local); off += size {
			end := min(off+size, len(tk.Local))
			slices = append(slices, slice{j: j, op: tk.Op, local: tk.Local[off:end:end], remote: tk.RemoteAddr + uint64(off), deadline: tk.Deadline})
		}
	}
	ptrs := make([]*slice, len(slices))
	for i := range slices {
		ptrs[i] = &slices[i]
	}
	p.dispatch(ptrs, 0)
}

// dispatch spreads slices over the lanes, least loaded first, opening
// lanes that are missing or broken. Only lanes opened after lane number
// after may take the slices: a retry must not go to a sibling lane that
// the same fault broke but that has not noticed yet.
func (p *peer) dispatch(ss []*slice, after uint64) {
	p.mu.Lock()
	if p.closed != nil {
		err := p.closed
		p.mu.Unlock()
		for _, s := range ss {
			s.finish(err)
		}
		return
	}
	per := make([][]*slice, len(p.lanes))
	for _, s := range ss {
		best := -1
		var bestLoad int64
		for i, l := range p.lanes {
			if l == nil || l.broken.Load() {
				l = p.t.newLane(p)
				p.lanes[i] = l
			}
			if l.born <= after {
				continue
			}
			ld := l.load.Load()
			if best < 0 || ld < bestLoad {
				best, bestLoad = i, ld
			}
		}
		if best < 0 {
			// Cannot happen (the failed lane's slot was reopened above);
			// fall back to the least loaded lane rather than drop s.
			for i, l := range p.lanes {
				if ld := l.load.Load(); best < 0 || ld < bestLoad {
					best, bestLoad = i, ld
				}
			}
		}
		l := p.lanes[best]
		l.load.Add(int64(len(s.local)))
		per[best] = append(per[best], s)
	}
	lanes := append([]*lane(nil), p.lanes...)
	p.mu.Unlock()
	for i, l := range lanes {
		if len(per[i]) > 0 {
			l.enqueue(per[i])
		}
	}
}

// retry sends slices of a broken lane again, on lanes opened after lane
// number after, or fails them.
func (p *peer) retry(ss []*slice, cause error, after uint64) {
	var again []*slice
	now := time.Now()
	for _, s := range ss {
		switch {
		case s.j.task.Aborted():
			s.finish(transport.ErrTimeout)
		case !s.deadline.IsZero() && !now.Before(s.deadline):
			s.finish(fmt.Errorf("%w: %v", transport.ErrTimeout, cause))
		case s.tries >= p.t.cfg.Retries:
			s.finish(fmt.Errorf("%w: %s: %w", transport.ErrPeerGone, p.addr, cause))
		default:
			s.tries++
			again = append(again, s)
		}
	}
	if len(again) > 0 {
		p.dispatch(again, after)
	}
}

func (p *peer) close(err error) {
	p.mu.Lock()
	if p.closed == nil {
		p.closed = err
	}
	lanes := p.lanes
	p.mu.Unlock()
	for _, l := range lanes {
		if l != nil {
			l.fail(err)
		}
	}
}

// lane is one persistent connection with a writer and a reader goroutine.
// Slices leave in queue order and their replies come back in the same
// order, so the reader matches them through the inflight FIFO.
type lane struct {
	p *peer

	mu     sync.Mutex
	queue  []*slice
	spare  []*slice
	conn   *net.TCPConn
	err    error // set once the lane is broken
	wake   chan struct{}
	broken atomic.Bool
	load   atomic.Int64  // bytes queued or in flight
	born   uint64        // this lane's number
	cutoff atomic.Uint64 // newest lane number when this one broke

	inflight chan *slice
}

func (t *Transport) newLane(p *peer) *lane {
	l := &lane{p: p, born: p.gen.Add(1), wake: make(chan struct{}, 1), inflight: make(chan *slice, t.cfg.Window)}
	t.wg.Add(1)
	go l.writer()
	return l
}

func (l *lane) enqueue(ss []*slice) {
	l.mu.Lock()
	if l.err != nil {
		err := l.err
		l.mu.Unlock()
		l.retry(ss, err)
		return
	}
	l.queue = append(l.queue, ss...)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// fail breaks the lane: the connection closes, and every slice not yet
// answered is retried or failed by the goroutine that holds it.
func (l *lane) fail(err error) {
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return
	}
	// Read before marking the lane broken, so that the lane replacing it
	// is numbered above the cutoff.
	l.cutoff.Store(l.p.gen.Load())
	l.err = err
	l.broken.Store(true)
	q := l.queue
	l.queue = nil
	if l.conn != nil {
		l.conn.Close()
	}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	l.unload(q)
	l.retry(q, err)
}

// retry resends slices of this broken lane on lanes opened after it broke.
func (l *lane) retry(ss []*slice, cause error) { l.p.retry(ss, cause, l.cutoff.Load()) }

func (l *lane) unload(ss []*slice) {
	for _, s := range ss {
		l.load.Add(-int64(len(s.local)))
	}
}

// take waits for queued slices; nil means the lane is broken.
func (l *lane) take() []*slice {
	for {
		l.mu.Lock()
		if l.err != nil {
			l.mu.Unlock()
			return nil
		}
		if len(l.queue) > 0 {
			q := l.queue
			l.queue = l.spare[:0]
			l.spare = q
			l.mu.Unlock()
			return q
		}
		l.mu.Unlock()
		<-l.wake
	}
}

func (l *lane) dial() error {
	t := l.p.t
	d := net.Dialer{Timeout: t.cfg.DialTimeout}
	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.DialTimeout)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", l.p.addr)
	if err != nil {
		return fmt.Errorf("dial %s: %w", l.p.addr, err)
	}
	tc := c.(*net.TCPConn)
	t.tune(tc)
	if t.cfg.Token != nil {
		if err := auth.Client(tc, t.cfg.Token, auth.PurposeTCPLane, t.cfg.DialTimeout); err != nil {
			tc.Close()
			return fmt.Errorf("authenticate to %s: %w", l.p.addr, err)
		}
	}
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		tc.Close()
		return l.err
	}
	l.conn = tc
	l.mu.Unlock()
	return nil
}

func (l *lane) writer() {
	t := l.p.t
	defer t.wg.Done()
	if err := l.dial(); err != nil {
		l.fail(err)
		close(l.inflight)
		return
	}
	t.wg.Add(1)
	go l.reader()
	defer close(l.inflight)

	w := &laneWriter{l: l, hdrs: make([]byte, 0, maxBatchHeaders*HeaderSize)}
	for {
		q := l.take()
		if q == nil {
			return
		}
		for i, s := range q {
			if err := w.add(s); err != nil {
				// Break the lane first so retries go to a new one.
				l.fail(err)
				rest := append(w.unacked, q[i+1:]...)
				l.unload(rest)
				l.retry(rest, err)
				return
			}
		}
		if err := w.flush(); err != nil {
			l.fail(err)
			l.unload(w.unacked)
			l.retry(w.unacked, err)
			return
		}
		clear(q) // the spare buffer must not keep slices alive
	}
}

// Limits of one writev: many small requests leave in one system call, and
// a large payload is never held back behind more than this.
const (
	maxBatchHeaders = 64
	maxBatchBytes   = 4 << 20
)

// laneWriter gathers headers and payloads of consecutive slices into one
// writev, straight from registered memory.
type laneWriter struct {
	l       *lane
	hdrs    []byte      // headers of the pending batch, contiguous
	hdrRun  int         // start in hdrs of headers not yet in iov
	iov     net.Buffers // pending segments
	out     net.Buffers // scratch that WriteTo consumes
	bytes   int
	dl      time.Time // earliest deadline of the batch
	wdl     time.Time // deadline set on the connection
	unacked []*slice  // v1 WRITEs, done once written
}

// add queues s. On error, the slices not handed to the reader (v1
// WRITEs of the batch and s itself if it was not) are in w.unacked.
func (w *laneWriter) add(s *slice) error {
	l := w.l
	if s.j.task.Aborted() {
		l.load.Add(-int64(len(s.local)))
		s.finish(transport.ErrTimeout)
		return nil
	}
	if len(w.hdrs) == cap(w.hdrs) || len(w.iov) >= 2*maxBatchHeaders || w.bytes >= maxBatchBytes {
		if err := w.flush(); err != nil {
			w.unacked = append(w.unacked, s) // not sent: the caller retries it
			return err
		}
	}
	acked := l.p.v2 || s.op == transport.Read
	if acked {
		select {
		case l.inflight <- s:
		default:
			// The window is full: send what is pending, whose replies are
			// what frees it, then wait.
			if err := w.flush(); err != nil {
				w.unacked = append(w.unacked, s)
				return err
			}
			l.inflight <- s
		}
	} else {
		w.unacked = append(w.unacked, s)
	}
	op := uint8(OpRead)
	if s.op == transport.Write {
		op = OpWrite
	}
	if l.p.v2 {
		op |= V2Flag
	}
	n := len(w.hdrs)
	w.hdrs = w.hdrs[:n+HeaderSize]
	Header{Size: uint64(len(s.local)), Addr: s.remote, Opcode: op}.Put(w.hdrs[n:])
	w.bytes += HeaderSize
	if w.dl.IsZero() || s.deadline.Before(w.dl) {
		w.dl = s.deadline
	}
	if s.op == transport.Write {
		w.iov = append(w.iov, w.hdrs[w.hdrRun:], s.local)
		w.hdrRun = len(w.hdrs)
		w.bytes += len(s.local)
	}
	return nil
}

func (w *laneWriter) flush() error {
	if w.hdrRun < len(w.hdrs) {
		w.iov = append(w.iov, w.hdrs[w.hdrRun:])
	}
	if len(w.iov) == 0 {
		return nil
	}
	l := w.l
	if !w.dl.Equal(w.wdl) {
		w.wdl = w.dl
		l.conn.SetWriteDeadline(w.wdl)
	}
	w.out = append(w.out[:0], w.iov...)
	_, err := w.out.WriteTo(l.conn)
	clear(w.iov)
	w.iov, w.hdrs, w.hdrRun, w.bytes, w.dl = w.iov[:0], w.hdrs[:0], 0, 0, time.Time{}
	if err != nil {
		return err
	}
	// v1 WRITEs are done once the kernel has the bytes.
	for _, s := range w.unacked {
		l.load.Add(-int64(len(s.local)))
		s.finish(nil)
	}
	clear(w.unacked)
	w.unacked = w.unacked[:0]
	return nil
}

var errRejected = errors.New("target rejected the request")

func (l *lane) reader() {
	t := l.p.t
	defer t.wg.Done()
	l.mu.Lock()
	c := l.conn
	l.mu.Unlock()
	br := bufio.NewReaderSize(c, 16<<10)
	var st [StatusSize]byte
	var rdl time.Time
	var broken error
	for s := range l.inflight {
		if broken == nil {
			broken = l.receive(c, br, s, st[:], &rdl)
			if broken == nil {
				continue
			}
			l.fail(broken)
			if errors.Is(broken, errRejected) {
				continue // s already failed; the rest are retried
			}
		}
		l.load.Add(-int64(len(s.local)))
		l.retry([]*slice{s}, broken)
	}
}

// receive reads the reply of s. On a connection error s is left for the
// caller to retry; on a rejection s fails here.
func (l *lane) receive(c *net.TCPConn, br *bufio.Reader, s *slice, st []byte, rdl *time.Time) error {
	if !s.deadline.Equal(*rdl) {
		*rdl = s.deadline
		c.SetReadDeadline(s.deadline)
	}
	if l.p.v2 {
		if _, err := io.ReadFull(br, st); err != nil {
			return err
		}
		v, err := ParseStatus(st)
		if err != nil || v != StatusOK {
			l.load.Add(-int64(len(s.local)))
			if err == nil {
				err = fmt.Errorf("%w: [%#x,+%d) at %s", transport.ErrRejected, s.remote, len(s.local), l.p.addr)
			} else {
				err = fmt.Errorf("%w: %w", transport.ErrProtocol, err)
			}
			s.finish(err)
			return fmt.Errorf("%w: %w", errRejected, err)
		}
	}
	if s.op == transport.Read {
		if _, err := io.ReadFull(br, s.local); err != nil {
			return err
		}
	}
	l.load.Add(-int64(len(s.local)))
	s.finish(nil)
	return nil
}
