package tcp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/internal/netx"
)

// Limits of one reply writev on the server side. maxReplyReads bounds
// the leases (and iov entries) that tiny pipelined READs pin until sent;
// 1024 is IOV_MAX, one writev.
const (
	maxReplyStatuses = 128
	maxReplyBytes    = 4 << 20
	maxReplyReads    = 1024
)

// serverConn serves requests on one accepted connection, in order, until
// EOF or error. It accepts both pipelined clients (many headers in flight)
// and the reference's one-request-per-connection clients.
//
// Replies are gathered while the next request is already readable: status
// words and READ data of several requests then leave in one writev,
// straight from registered memory (the regions stay pinned until sent).
type serverConn struct {
	t   *Transport
	nc  *netx.Conn // tracks busy and idle for the connection caps
	c   *net.TCPConn
	rc  interface{ Control(func(uintptr)) error }
	br  *bufio.Reader
	hdr [HeaderSize]byte

	out    []byte // status words of the pending reply; never reallocated
	outRun int    // start in out of words not yet in iov
	iov    net.Buffers
	wv     net.Buffers // scratch that WriteTo consumes
	leases []transport.Lease
	bytes  int
}

func (t *Transport) serveConn(nc *netx.Conn) {
	c := nc.Conn.(*net.TCPConn)
	t.tune(c)
	if t.cfg.Token != nil {
		// Idle (evictable at the caps) until the peer proved the token.
		if err := auth.Server(c, t.cfg.Token, auth.PurposeTCPLane, t.cfg.DialTimeout); err != nil {
			t.authFailed.Add(1)
			t.log.Debug("tcp: peer failed authentication", "peer", c.RemoteAddr(), "err", err)
			return
		}
	}
	s := &serverConn{t: t, nc: nc, c: c, br: bufio.NewReaderSize(c, 8<<10), out: make([]byte, 0, maxReplyStatuses*StatusSize)}
	if rc, err := c.SyscallConn(); err == nil {
		s.rc = rc
	}
	err := s.loop()
	s.releaseAll()
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		t.log.Debug("tcp: server connection ended", "peer", c.RemoteAddr(), "err", err)
	}
}

func (s *serverConn) loop() error {
	reg := s.t.env.Registry
	idle := true // as accepted
	for {
		// Send what the client waits for before blocking on the network.
		if err := s.flushUnless(HeaderSize); err != nil {
			return err
		}
		s.c.SetReadDeadline(time.Time{})
		if !idle && s.br.Buffered() < HeaderSize && len(s.leases) == 0 {
			s.nc.Idle() // between requests: evictable at the caps
			idle = true
		}
		if _, err := io.ReadFull(s.br, s.hdr[:]); err != nil {
			return err
		}
		if idle {
			s.nc.Busy()
			idle = false
		}
		h, err := ParseHeader(s.hdr[:])
		var lease transport.Lease
		if err == nil {
			lease, err = reg.Acquire(h.Addr, h.Size)
		}
		if err != nil {
			// Like the reference: tell a v2 client, then close, since a
			// refused WRITE's payload cannot be skipped safely.
			s.t.rejected.Add(1)
			if h.V2() {
				s.status(StatusRejected)
			}
			s.flush()
			if h.IsWrite() {
				s.linger(h.Size)
			}
			return err
		}
		// A stalled peer must not pin memory forever.
		s.c.SetDeadline(time.Now().Add(s.t.cfg.IdleTimeout))
		if h.IsWrite() {
			if err := s.flushUnless(int(min(h.Size, 1<<30))); err != nil {
				lease.Release()
				return err
			}
			_, err = io.ReadFull(s.br, lease.Mem)
			lease.Release()
			if err != nil {
				return err
			}
			s.t.bytesIn.Add(h.Size)
			if h.V2() {
				s.status(StatusOK)
			}
			continue
		}
		if h.V2() {
			s.status(StatusOK)
		}
		if s.outRun < len(s.out) {
			s.iov = append(s.iov, s.out[s.outRun:])
			s.outRun = len(s.out)
		}
		s.iov = append(s.iov, lease.Mem)
		s.leases = append(s.leases, lease)
		s.bytes += len(lease.Mem)
		s.t.bytesOut.Add(h.Size)
	}
}

// status queues a status word, sending the pending reply first when the
// word buffer is full.
func (s *serverConn) status(v uint64) {
	if len(s.out) == cap(s.out) {
		s.flush()
	}
	s.out = binary.LittleEndian.AppendUint64(s.out, v)
}

// flushUnless sends the pending reply unless need more bytes can be read
// without blocking and the reply is still small (statuses, bytes, READs).
func (s *serverConn) flushUnless(need int) error {
	if len(s.out) == 0 && len(s.iov) == 0 {
		return nil
	}
	if len(s.out) < cap(s.out) && s.bytes < maxReplyBytes && len(s.leases) < maxReplyReads && s.readable() >= need {
		return nil
	}
	return s.flush()
}

// readable is how many request bytes can be read now without blocking.
func (s *serverConn) readable() int {
	n := s.br.Buffered()
	if s.rc == nil {
		return n
	}
	var queued int
	s.rc.Control(func(fd uintptr) {
		queued, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ)
	})
	return n + queued
}

func (s *serverConn) flush() error {
	if s.outRun < len(s.out) {
		s.iov = append(s.iov, s.out[s.outRun:])
	}
	var err error
	if len(s.iov) > 0 {
		s.wv = append(s.wv[:0], s.iov...)
		_, err = s.wv.WriteTo(s.c)
	}
	s.releaseAll()
	return err
}

func (s *serverConn) releaseAll() {
	for _, l := range s.leases {
		l.Release()
	}
	clear(s.leases)
	clear(s.iov)
	s.leases, s.iov, s.out, s.outRun, s.bytes = s.leases[:0], s.iov[:0], s.out[:0], 0, 0
}

// Bounds of the drain after a refused WRITE.
const (
	lingerBytes = 64 << 20
	lingerTime  = 2 * time.Second
)

// linger ends a connection whose refused WRITE payload is still arriving
// without resetting it: closing with unread bytes sends an RST, which
// can destroy the refusal before the client reads it. Our half is shut
// (FIN after the reply) and the payload read and dropped, bounded in
// bytes and time.
func (s *serverConn) linger(size uint64) {
	s.c.CloseWrite()
	s.c.SetReadDeadline(time.Now().Add(lingerTime))
	io.CopyN(io.Discard, s.br, int64(min(size, lingerBytes)))
}
