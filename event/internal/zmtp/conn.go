package zmtp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

// ZMTP frame flags.
const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

// MaxFrame bounds one received frame; a peer announcing more is dropped
// rather than trusted with an allocation.
const MaxFrame = 256 << 20

// ErrProtocol reports a peer that broke the ZMTP framing rules.
var ErrProtocol = errors.New("zmtp: protocol error")

// Conn is one ZMTP connection after the handshake. Reads are buffered and
// go through ReadMsg; writes go straight to the socket and must come from
// one goroutine at a time.
type Conn struct {
	raw      net.Conn
	br       *bufio.Reader
	PeerType zmq4.SocketType

	buf  []byte
	offs []int
	msg  [][]byte
}

// bufConn feeds zmq4's handshake through our reader so no byte the peer
// sends right after its READY is lost in an unbuffered read.
type bufConn struct {
	net.Conn
	br *bufio.Reader
}

func (b bufConn) Read(p []byte) (int, error) { return b.br.Read(p) }

// Handshake runs the ZMTP 3.0 greeting and NULL-security READY exchange as
// a socket of type typ, within timeout.
func Handshake(raw net.Conn, typ zmq4.SocketType, server bool, timeout time.Duration) (*Conn, error) {
	br := bufio.NewReaderSize(raw, 64<<10)
	if timeout > 0 {
		_ = raw.SetDeadline(time.Now().Add(timeout))
	}
	zc, err := zmq4.Open(bufConn{raw, br}, null.Security(), typ, nil, server, nil)
	if err != nil {
		return nil, fmt.Errorf("zmtp: handshake with %s: %w", raw.RemoteAddr(), err)
	}
	_ = raw.SetDeadline(time.Time{})
	return &Conn{raw: raw, br: br, PeerType: zmq4.SocketType(zc.Peer.Meta["Socket-Type"])}, nil
}

// ReadMsg returns the next data message. Its frames alias a buffer that
// the following ReadMsg reuses. Commands (PING, ...) are skipped.
func (c *Conn) ReadMsg() ([][]byte, error) {
	for {
		c.buf = c.buf[:0]
		c.offs = c.offs[:0]
		cmd := false
		for {
			flag, err := c.br.ReadByte()
			if err != nil {
				if len(c.offs) > 0 {
					return nil, unexpected(err) // inside a multipart message
				}
				return nil, err
			}
			var size uint64
			if flag&flagLong != 0 {
				var b [8]byte
				if _, err := io.ReadFull(c.br, b[:]); err != nil {
					return nil, unexpected(err)
				}
				size = binary.BigEndian.Uint64(b[:])
			} else {
				s, err := c.br.ReadByte()
				if err != nil {
					return nil, unexpected(err)
				}
				size = uint64(s)
			}
			if size > MaxFrame {
				return nil, fmt.Errorf("%w: frame of %d bytes", ErrProtocol, size)
			}
			cmd = cmd || flag&flagCommand != 0
			start := len(c.buf)
			c.buf = grow(c.buf, int(size))
			if _, err := io.ReadFull(c.br, c.buf[start:]); err != nil {
				return nil, unexpected(err)
			}
			c.offs = append(c.offs, start)
			if flag&flagMore == 0 {
				break
			}
		}
		if cmd {
			continue
		}
		c.msg = c.msg[:0]
		for i, start := range c.offs {
			end := len(c.buf)
			if i+1 < len(c.offs) {
				end = c.offs[i+1]
			}
			c.msg = append(c.msg, c.buf[start:end:end])
		}
		return c.msg, nil
	}
}

func grow(b []byte, n int) []byte {
	if cap(b)-len(b) < n {
		nb := make([]byte, len(b), max(2*cap(b), len(b)+n, 4096))
		copy(nb, b)
		b = nb
	}
	return b[:len(b)+n]
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// Write writes whole messages built with AppendMsg.
func (c *Conn) Write(b []byte) error {
	_, err := c.raw.Write(b)
	return err
}

// WriteBuffers writes bufs with one writev where the socket allows.
func (c *Conn) WriteBuffers(bufs net.Buffers) error {
	_, err := bufs.WriteTo(c.raw)
	return err
}

// WaitReadable waits up to d for the start of a message, without
// consuming anything: a deadline inside ReadMsg could cut a message in
// half. It returns false when d passed.
func (c *Conn) WaitReadable(d time.Duration) (bool, error) {
	if c.br.Buffered() > 0 {
		return true, nil
	}
	_ = c.raw.SetReadDeadline(time.Now().Add(d))
	_, err := c.br.Peek(1)
	_ = c.raw.SetReadDeadline(time.Time{})
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return false, nil
	}
	return err == nil, err
}

// SetWriteDeadline bounds the next writes.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.raw.SetWriteDeadline(t) }

// Close closes the socket; a blocked ReadMsg or Write returns.
func (c *Conn) Close() error { return c.raw.Close() }

// RemoteAddr names the peer.
func (c *Conn) RemoteAddr() string { return c.raw.RemoteAddr().String() }

// HeaderLen is the size of a data frame header for a body of n bytes.
func HeaderLen(n int) int {
	if n > 255 {
		return 9
	}
	return 2
}

// AppendHeader appends a data frame header for a body of n bytes; more
// marks a frame that is not the last of its message.
func AppendHeader(dst []byte, n int, more bool) []byte {
	var flag byte
	if more {
		flag = flagMore
	}
	if n > 255 {
		dst = append(dst, flag|flagLong)
		return binary.BigEndian.AppendUint64(dst, uint64(n))
	}
	return append(dst, flag, byte(n))
}

// AppendMsg appends a whole message: every frame with its header.
func AppendMsg(dst []byte, frames ...[]byte) []byte {
	for i, f := range frames {
		dst = AppendHeader(dst, len(f), i < len(frames)-1)
		dst = append(dst, f...)
	}
	return dst
}
