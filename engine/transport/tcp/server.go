package tcp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"time"

	"github.com/crescent-kv/crescent/engine/transport"
)

// serverConn serves requests on one accepted connection, in order, until
// EOF or error. It accepts both pipelined clients (many headers in flight)
// and the reference's one-request-per-connection clients.
type serverConn struct {
	t   *Transport
	c   *net.TCPConn
	br  *bufio.Reader
	out []byte // status words not yet sent
	hdr [HeaderSize]byte
}

func (t *Transport) serveConn(c *net.TCPConn) {
	s := &serverConn{t: t, c: c, br: bufio.NewReaderSize(c, 8<<10), out: make([]byte, 0, 512)}
	err := s.loop()
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		t.log.Debug("tcp: server connection ended", "peer", c.RemoteAddr(), "err", err)
	}
}

func (s *serverConn) loop() error {
	reg := s.t.env.Registry
	for {
		// About to block on the network: send what the client waits for.
		if s.br.Buffered() < HeaderSize {
			if err := s.flush(); err != nil {
				return err
			}
		}
		s.c.SetReadDeadline(time.Time{})
		if _, err := io.ReadFull(s.br, s.hdr[:]); err != nil {
			return err
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
				s.flush()
			}
			return err
		}
		// A stalled peer must not pin memory forever.
		s.c.SetDeadline(time.Now().Add(s.t.cfg.IdleTimeout))
		if h.IsWrite() {
			if s.br.Buffered() < int(min(h.Size, 1<<30)) {
				if err := s.flush(); err != nil {
					lease.Release()
					return err
				}
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
		// Status words and data leave in one writev, straight from
		// registered memory.
		bufs := net.Buffers{s.out, lease.Mem}
		_, err = bufs.WriteTo(s.c)
		lease.Release()
		s.out = s.out[:0]
		if err != nil {
			return err
		}
		s.t.bytesOut.Add(h.Size)
	}
}

func (s *serverConn) status(v uint64) {
	s.out = binary.LittleEndian.AppendUint64(s.out, v)
}

func (s *serverConn) flush() error {
	if len(s.out) == 0 {
		return nil
	}
	_, err := s.c.Write(s.out)
	s.out = s.out[:0]
	return err
}
