package local

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/store/errcode"
)

// Wire constants (doc.go describes the format).
const (
	protoVersion = 1
	hdrLen       = 32
	// MaxInline is the largest value carried inside a frame; larger ones
	// move through a registered buffer or the shared cache.
	MaxInline = 64 << 20
	// maxFrame bounds every frame before its body is allocated.
	maxFrame = MaxInline + 1<<20
	// maxBatch bounds the items of one batch request.
	maxBatch = 1024
	// maxString bounds keys and messages.
	maxString = 64 << 10
	// maxRegions bounds the buffers one dummy registers.
	maxRegions = 64
	// maxFDs bounds the descriptors one read may carry.
	maxFDs = 2
	// helloFrame is the length field of a Hello request (its body is the
	// u32 version): a peer not yet allowed may claim no more.
	helloFrame = hdrLen - 4 + 4
	// readChunk is the first allocation for a frame's body and the least
	// it grows by.
	readChunk = 64 << 10
)

// Operations.
const (
	opHello byte = iota + 1
	opPing
	opRegister
	opUnregister
	opPut
	opGet
	opGetBuffer
	opRelease
	opExist
	opRemove
	opBatchPut
	opBatchGet
	opBatchGetBuffer
	opBatchExist
	opBatchRemove
	opMax
)

// Reply status byte.
const (
	stOK  byte = 0
	stErr byte = 1
)

// Source/destination kinds of a value in a request.
const (
	refNone   byte = 0 // value inline in the frame (or in the reply)
	refRegion byte = 1 // region id, offset, length in a registered buffer
	refShm    byte = 2 // in a reply: a view of the shared cache
)

type token [16]byte

type header struct {
	n      uint32 // bytes after the length field
	op     byte
	status byte
	id     uint64
	tok    token
}

func (h *header) put(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], h.n)
	b[4], b[5] = h.op, h.status
	b[6], b[7] = 0, 0
	binary.LittleEndian.PutUint64(b[8:], h.id)
	copy(b[16:32], h.tok[:])
}

func parseHeader(b []byte) (header, error) {
	h := header{n: binary.LittleEndian.Uint32(b[0:]), op: b[4], status: b[5], id: binary.LittleEndian.Uint64(b[8:])}
	copy(h.tok[:], b[16:32])
	switch {
	case h.n < hdrLen-4 || h.n > maxFrame:
		return h, fmt.Errorf("%w: frame of %d bytes (limit %d)", ErrProtocol, h.n, maxFrame)
	case h.op == 0 || h.op >= opMax:
		return h, fmt.Errorf("%w: unknown operation %d", ErrProtocol, h.op)
	case b[6] != 0 || b[7] != 0:
		return h, fmt.Errorf("%w: reserved header bytes set", ErrProtocol)
	}
	return h, nil
}

// Errors of the local protocol.
var (
	// ErrProtocol: a malformed frame; the connection is closed.
	ErrProtocol = errors.New("local: protocol error")
	// ErrDisconnected: the connection to the real client ended; the next
	// call dials again.
	ErrDisconnected = errors.New("local: disconnected from the real client")
	// ErrClosed: the dummy or server was closed.
	ErrClosed = errors.New("local: closed")
)

// enc builds a frame: header space first, then the body.
type enc struct{ b []byte }

func newEnc(op byte, id uint64, tok token) *enc {
	e := &enc{b: make([]byte, hdrLen, 256)}
	h := header{op: op, id: id, tok: tok}
	h.put(e.b)
	return e
}

func (e *enc) u8(v byte)      { e.b = append(e.b, v) }
func (e *enc) u32(v uint32)   { e.b = binary.LittleEndian.AppendUint32(e.b, v) }
func (e *enc) u64(v uint64)   { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *enc) i32(v int32)    { e.u32(uint32(v)) }
func (e *enc) str(s string)   { e.u32(uint32(len(s))); e.b = append(e.b, s...) }
func (e *enc) bytes(p []byte) { e.u32(uint32(len(p))); e.b = append(e.b, p...) }
func (e *enc) bool(v bool) {
	if v {
		e.u8(1)
	} else {
		e.u8(0)
	}
}

// frame finishes the frame: length and status.
func (e *enc) frame(status byte) []byte {
	binary.LittleEndian.PutUint32(e.b[0:], uint32(len(e.b)-4))
	e.b[5] = status
	return e.b
}

// errBody encodes err as a reply body: its code and message.
func (e *enc) err(err error) {
	e.i32(int32(errcode.CodeOf(err)))
	e.str(trunc(err.Error()))
}

func trunc(s string) string {
	if len(s) > maxString {
		return s[:maxString]
	}
	return s
}

// dec reads a body; the first failure sticks and every later read
// returns zero values.
type dec struct {
	b   []byte
	err error
}

func (d *dec) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: short or bad %s", ErrProtocol, what)
	}
}

func (d *dec) take(n int, what string) []byte {
	if d.err != nil || n < 0 || n > len(d.b) {
		d.fail(what)
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

func (d *dec) u8() byte {
	p := d.take(1, "byte")
	if p == nil {
		return 0
	}
	return p[0]
}

func (d *dec) u32() uint32 {
	p := d.take(4, "u32")
	if p == nil {
		return 0
	}
	return binary.LittleEndian.Uint32(p)
}

func (d *dec) u64() uint64 {
	p := d.take(8, "u64")
	if p == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(p)
}

func (d *dec) i32() int32 { return int32(d.u32()) }
func (d *dec) bool() bool { return d.u8() != 0 }

// blob is a length-prefixed byte string of at most limit bytes, aliasing
// the frame.
func (d *dec) blob(limit int, what string) []byte {
	n := d.u32()
	if d.err == nil && int64(n) > int64(limit) {
		d.err = fmt.Errorf("%w: %s of %d bytes (limit %d)", ErrProtocol, what, n, limit)
		return nil
	}
	return d.take(int(n), what)
}

func (d *dec) str() string { return string(d.blob(maxString, "string")) }

// count is a batch length, bounded before anything is allocated for it.
func (d *dec) count() int {
	n := d.u32()
	if d.err == nil && n > maxBatch {
		d.err = fmt.Errorf("%w: batch of %d items (limit %d)", ErrProtocol, n, maxBatch)
		return 0
	}
	return int(n)
}

// errReply decodes an error body.
func (d *dec) errReply() error {
	c := errcode.Code(d.i32())
	msg := d.str()
	if d.err != nil {
		return d.err
	}
	if c == errcode.OK {
		return fmt.Errorf("%w: error reply without a code", ErrProtocol)
	}
	return errcode.FromCode(c, msg)
}

func (d *dec) done() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", ErrProtocol, len(d.b))
	}
	return d.err
}

// fconn reads and writes frames on a Unix stream socket, collecting the
// descriptors that arrive with SCM_RIGHTS. Reads go through a small
// buffer, so a frame usually costs one recvmsg; a descriptor arrives with
// the first bytes of its frame's header, so it is in fds by the time the
// frame is parsed.
type fconn struct {
	c    *net.UnixConn
	oob  []byte
	fds  []int  // received, not yet claimed
	buf  []byte // received bytes not yet consumed: buf[r:w]
	r, w int
}

// readBuf is the read buffer of one connection.
const readBuf = 16 << 10

func newFconn(c *net.UnixConn) *fconn {
	return &fconn{c: c, oob: make([]byte, unix.CmsgSpace(4*maxFDs))}
}

// recv is one recvmsg into b, keeping the descriptors that come along.
func (f *fconn) recv(b []byte) (int, error) {
	n, oobn, flags, _, err := f.c.ReadMsgUnix(b, f.oob)
	if oobn > 0 {
		if perr := f.takeFDs(f.oob[:oobn]); perr != nil {
			return 0, perr
		}
	}
	if flags&unix.MSG_CTRUNC != 0 {
		return 0, fmt.Errorf("%w: too many descriptors in one message", ErrProtocol)
	}
	n = max(n, 0)
	if err == nil && n == 0 && len(b) > 0 {
		err = io.EOF
	}
	return n, err
}

// fill reads once more into the buffer.
func (f *fconn) fill() error {
	if f.buf == nil {
		f.buf = make([]byte, readBuf)
	}
	if f.r > 0 {
		f.w = copy(f.buf, f.buf[f.r:f.w])
		f.r = 0
	}
	n, err := f.recv(f.buf[f.w:])
	f.w += n
	if n > 0 {
		return nil // bytes first; an error comes back on the next read
	}
	return err
}

func (f *fconn) takeFDs(oob []byte) error {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return fmt.Errorf("%w: control message: %v", ErrProtocol, err)
	}
	var bad bool
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if len(f.fds) >= maxFDs {
				unix.Close(fd)
				bad = true
				continue
			}
			f.fds = append(f.fds, fd)
		}
	}
	if bad {
		return fmt.Errorf("%w: more than %d unclaimed descriptors", ErrProtocol, maxFDs)
	}
	return nil
}

// claimFD takes the oldest received descriptor, or -1.
func (f *fconn) claimFD() int {
	if len(f.fds) == 0 {
		return -1
	}
	fd := f.fds[0]
	f.fds = f.fds[1:]
	return fd
}

// closeFDs closes descriptors nobody claimed.
func (f *fconn) closeFDs() {
	for _, fd := range f.fds {
		unix.Close(fd)
	}
	f.fds = nil
}

// read returns the next frame: header and body. headerWait bounds the
// wait for its first byte (0: none), bodyWait the rest.
func (f *fconn) read(headerWait, bodyWait time.Duration) (header, []byte, error) {
	return f.readMax(headerWait, bodyWait, maxFrame)
}

// readMax is read with frames limited to limit bytes after the length.
func (f *fconn) readMax(headerWait, bodyWait time.Duration, limit uint32) (header, []byte, error) {
	if f.r == f.w {
		if headerWait > 0 {
			f.c.SetReadDeadline(time.Now().Add(headerWait))
		} else {
			f.c.SetReadDeadline(time.Time{})
		}
		if err := f.fill(); err != nil {
			return header{}, nil, err
		}
	}
	f.c.SetReadDeadline(time.Now().Add(bodyWait))
	for f.w-f.r < hdrLen {
		if err := f.fill(); err != nil {
			return header{}, nil, err
		}
	}
	h, err := parseHeader(f.buf[f.r : f.r+hdrLen])
	if err != nil {
		return h, nil, err
	}
	if h.n > limit {
		return h, nil, fmt.Errorf("%w: frame of %d bytes where at most %d fit", ErrProtocol, h.n, limit)
	}
	f.r += hdrLen
	need := int(h.n) - (hdrLen - 4)
	// The body grows as its bytes arrive, doubling: a header alone must
	// not claim the size it declares.
	body := make([]byte, 0, min(need, readChunk))
	for len(body) < need {
		if len(body) == cap(body) {
			if f.r == f.w { // grow only once more bytes are here
				if err := f.fill(); err != nil {
					return h, nil, unexpectedEOF(err)
				}
			}
			body = slices.Grow(body, min(need, max(2*cap(body), readChunk))-len(body))
		}
		room := body[len(body):min(cap(body), need)]
		k := copy(room, f.buf[f.r:f.w])
		f.r += k
		if k == 0 { // nothing buffered: straight from the socket
			n, err := f.recv(room)
			k = n
			if err != nil && len(body)+k < need {
				return h, nil, unexpectedEOF(err)
			}
		}
		body = body[:len(body)+k]
	}
	return h, body, nil
}

func unexpectedEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// write sends frame b, with fd (when >= 0) attached to its first bytes.
// The caller serialises writes.
func (f *fconn) write(b []byte, fd int) error {
	if fd >= 0 {
		n, _, err := f.c.WriteMsgUnix(b[:hdrLen], unix.UnixRights(fd), nil)
		if err != nil {
			return err
		}
		if n != hdrLen {
			return fmt.Errorf("local: short write of a frame header (%d bytes)", n)
		}
		b = b[hdrLen:]
	}
	_, err := f.c.Write(b)
	return err
}
