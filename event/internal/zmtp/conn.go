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

	"github.com/crescent-kv/crescent/internal/netx"
)

// ZMTP frame flags.
const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

// Defaults of Limits.
const (
	// DefaultMaxMessage bounds the bytes of one message (the sum of its
	// frames): vLLM batches are far smaller.
	DefaultMaxMessage = 64 << 20
	// DefaultMaxFrames bounds the frames of one message (vLLM's live
	// messages have 3, replay replies 4).
	DefaultMaxFrames = 16
	// MaxCommand bounds one command frame after the handshake (PING,
	// PONG, ZMTP 3.1 SUBSCRIBE with a 256-byte topic, ...). Commands are
	// skipped without being buffered.
	MaxCommand = 512
	// maxHandshake bounds everything the peer may send during the
	// handshake (greeting and READY with its metadata).
	maxHandshake = 64 << 10
	// minBuf is the first allocation for a message body; it then doubles
	// as bytes arrive.
	minBuf = 4096
)

// Limits bound what a peer may send in one message. A message over a
// limit is refused as soon as its header shows it, before anything is
// allocated for it, with an error wrapping ErrLimit; the caller ends the
// connection. Zero fields take the defaults.
type Limits struct {
	MaxMessage int // bytes, the sum of the message's frames
	MaxFrames  int // frames
}

func (l Limits) withDefaults() Limits {
	if l.MaxMessage <= 0 {
		l.MaxMessage = DefaultMaxMessage
	}
	if l.MaxFrames <= 0 {
		l.MaxFrames = DefaultMaxFrames
	}
	return l
}

var (
	// ErrProtocol reports a peer that broke the ZMTP framing rules.
	ErrProtocol = errors.New("zmtp: protocol error")
	// ErrLimit reports a peer that sent more than Limits (or the
	// handshake's and commands' fixed bounds) allow.
	ErrLimit = errors.New("zmtp: peer exceeded a limit")
)

// Conn is one ZMTP connection after the handshake. Reads are buffered and
// go through ReadMsg; writes go straight to the socket and must come from
// one goroutine at a time.
type Conn struct {
	raw      net.Conn
	br       *bufio.Reader
	PeerType zmq4.SocketType
	lim      Limits

	buf  []byte
	offs []int
	msg  [][]byte
}

// hsReader feeds zmq4's handshake through our buffered reader, so no byte
// the peer sends right after its READY is lost in an unbuffered read, and
// bounds it: zmq4 allocates a frame's declared size before reading it, so
// a frame header is only handed on once its size fits what is left of
// maxHandshake.
type hsReader struct {
	net.Conn
	br     *bufio.Reader
	greet  int // greeting bytes still to pass (64 in ZMTP 3.0)
	left   int // bytes of the current frame (header and body) still to pass
	budget int // bytes the handshake may still read
}

func (h *hsReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if h.greet == 0 && h.left == 0 {
		hdr, err := h.br.Peek(2)
		if err != nil {
			return 0, unexpected(err)
		}
		n, size := 2, uint64(hdr[1])
		if hdr[0]&flagLong != 0 {
			if hdr, err = h.br.Peek(9); err != nil {
				return 0, unexpected(err)
			}
			n, size = 9, binary.BigEndian.Uint64(hdr[1:])
		}
		if h.budget < n || size > uint64(h.budget-n) {
			return 0, fmt.Errorf("%w: handshake frame of %d bytes (at most %d bytes in all)", ErrLimit, size, maxHandshake)
		}
		h.left = n + int(size)
	}
	lim := h.left
	if h.greet > 0 {
		lim = h.greet
	}
	n, err := h.br.Read(p[:min(len(p), lim)])
	if h.greet > 0 {
		h.greet -= n
	} else {
		h.left -= n
	}
	h.budget -= n
	return n, err
}

// Handshake runs the ZMTP 3.0 greeting and NULL-security READY exchange as
// a socket of type typ, within timeout.
func Handshake(raw net.Conn, typ zmq4.SocketType, server bool, timeout time.Duration) (*Conn, error) {
	br := bufio.NewReaderSize(raw, 64<<10)
	if timeout > 0 {
		_ = raw.SetDeadline(time.Now().Add(timeout))
	}
	hs := &hsReader{Conn: raw, br: br, greet: 64, budget: maxHandshake + 64}
	zc, err := zmq4.Open(hs, null.Security(), typ, nil, server, nil)
	if err != nil {
		return nil, fmt.Errorf("zmtp: handshake with %s: %w", raw.RemoteAddr(), err)
	}
	_ = raw.SetDeadline(time.Time{})
	return &Conn{raw: raw, br: br, PeerType: zmq4.SocketType(zc.Peer.Meta["Socket-Type"])}, nil
}

// Busy and Idle tell the netx loop that accepted the connection (if one
// did) whether the peer is doing work, so idle peers are evicted first.
func (c *Conn) Busy() {
	if nc, ok := c.raw.(*netx.Conn); ok {
		nc.Busy()
	}
}

// Idle: see Busy.
func (c *Conn) Idle() {
	if nc, ok := c.raw.(*netx.Conn); ok {
		nc.Idle()
	}
}

// SetLimits bounds the messages ReadMsg accepts from now on.
func (c *Conn) SetLimits(l Limits) { c.lim = l }

// ReadMsg returns the next data message. Its frames alias a buffer that
// the following ReadMsg reuses. Commands (PING, ...) are skipped. The
// buffer grows as bytes arrive, never to a size only announced: memory
// held is at most about twice what the peer actually sent.
func (c *Conn) ReadMsg() ([][]byte, error) {
	lim := c.lim.withDefaults()
next:
	for {
		c.buf = c.buf[:0]
		c.offs = c.offs[:0]
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
			if flag&flagCommand != 0 {
				// A command is one frame on its own (ZMTP 3.0 §2.3).
				if len(c.offs) > 0 || flag&flagMore != 0 {
					return nil, fmt.Errorf("%w: command frame inside a multipart message", ErrProtocol)
				}
				if size > MaxCommand {
					return nil, fmt.Errorf("%w: command of %d bytes (at most %d)", ErrLimit, size, MaxCommand)
				}
				if _, err := c.br.Discard(int(size)); err != nil {
					return nil, unexpected(err)
				}
				continue next
			}
			if len(c.offs) >= lim.MaxFrames {
				return nil, fmt.Errorf("%w: message of more than %d frames", ErrLimit, lim.MaxFrames)
			}
			if size > uint64(lim.MaxMessage-len(c.buf)) {
				return nil, fmt.Errorf("%w: message of more than %d bytes (frame %d announces %d)",
					ErrLimit, lim.MaxMessage, len(c.offs)+1, size)
			}
			start := len(c.buf)
			if err := c.readBody(int(size)); err != nil {
				return nil, unexpected(err)
			}
			c.offs = append(c.offs, start)
			if flag&flagMore == 0 {
				break
			}
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

// readBody appends n bytes read from the peer to c.buf, doubling the
// buffer only when what arrived has filled it.
func (c *Conn) readBody(n int) error {
	want := len(c.buf) + n
	for len(c.buf) < want {
		if len(c.buf) == cap(c.buf) {
			nb := make([]byte, len(c.buf), min(want, max(2*cap(c.buf), minBuf)))
			copy(nb, c.buf)
			c.buf = nb
		}
		end := min(want, cap(c.buf))
		got, err := io.ReadFull(c.br, c.buf[len(c.buf):end])
		c.buf = c.buf[:len(c.buf)+got]
		if err != nil {
			return err
		}
	}
	return nil
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
