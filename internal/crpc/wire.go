package crpc

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

const (
	magic   = "CRPC"
	version = 2
	// alpn is crpc's TLS application protocol.
	alpn = "crpc"
	// versionTLSRequired in a server's preface: this server speaks crpc
	// only inside TLS.
	versionTLSRequired = 0xff
	prefaceLen         = 8
	headerLen          = 9

	// DefaultMaxFrame bounds a frame's body unless configured: generous
	// for the master's batch RPCs (a 10,000-key batch of 4 KiB keys is 40
	// MiB) while a peer cannot make either side hold much more.
	DefaultMaxFrame = 64 << 20
	// maxFrameLimit is the most any configuration may allow.
	maxFrameLimit = 1 << 30

	kindRequest = 1
	kindReply   = 2
	kindError   = 3
	kindCancel  = 4
	kindPing    = 5
	kindPong    = 6
	// kindExpired is never on the wire: the sweeper's frame for a call
	// past its call timeout (WithCallTimeout).
	kindExpired = 0x80

	// requestFixed is the request body before the method name: u64
	// timeout in microseconds, u8 method-name length.
	requestFixed = 9
)

// ErrNotCRPC is returned by Dial when the server answers with something
// other than a crpc preface (a gRPC-only server, say).
var ErrNotCRPC = errors.New("crpc: the server does not speak crpc")

// ErrTLSRequired is returned by Dial without WithTLS when the server
// serves crpc only over TLS.
var ErrTLSRequired = errors.New("crpc: the server requires TLS (dial with WithTLS)")

// errBadFrame reports a frame that breaks the format.
var errBadFrame = errors.New("crpc: malformed frame")

func preface() []byte {
	p := make([]byte, prefaceLen)
	copy(p, magic)
	p[4] = version
	return p
}

func tlsRequiredPreface() []byte {
	p := preface()
	p[4] = versionTLSRequired
	return p
}

// checkPreface validates a peer's preface.
func checkPreface(p []byte) error {
	if string(p[:4]) != magic {
		return ErrNotCRPC
	}
	if p[4] == versionTLSRequired {
		return ErrTLSRequired
	}
	if p[4] == versionTokenRequired {
		return ErrTokenRequired
	}
	if p[4] != version {
		return fmt.Errorf("crpc: version %d, this side speaks %d", p[4], version)
	}
	return nil
}

// frame is one decoded frame; its body is a fresh slice (handlers keep
// it). held is what the reader's reserve hook granted for it.
type frame struct {
	id   uint32
	kind byte
	body []byte
	held int
}

// reader decodes frames of at most max body bytes.
type reader struct {
	r   *bufio.Reader
	max int
	hdr [headerLen]byte
	// onHeader, when set, runs once a header is in and before its body
	// is read (the server arms the frame deadline there); whole says the
	// body is already buffered (no read will wait).
	onHeader func(whole bool)
	// reserve, when set, is asked for n more bytes before the body
	// buffer grows by n (the server's memory budget); an error ends the
	// read. release gives back what a failed read had reserved.
	reserve func(n int) error
	release func(n int)
}

func newReader(r io.Reader, max int) *reader {
	return &reader{r: bufio.NewReaderSize(r, 64<<10), max: max}
}

// buffered is the number of bytes read ahead: a next frame whose header
// is among them needs no read to start.
func (rd *reader) buffered() int { return rd.r.Buffered() }

// growStep is the first allocation for a body and the least it grows by.
const growStep = 64 << 10

// next reads one frame.
func (rd *reader) next() (frame, error) {
	if _, err := io.ReadFull(rd.r, rd.hdr[:]); err != nil {
		return frame{}, err
	}
	n := binary.LittleEndian.Uint32(rd.hdr[0:4])
	f := frame{id: binary.LittleEndian.Uint32(rd.hdr[4:8]), kind: rd.hdr[8]}
	if uint64(n) > uint64(rd.max) {
		return frame{}, fmt.Errorf("%w: %d-byte body > %d", errBadFrame, n, rd.max)
	}
	if f.kind < kindRequest || f.kind > kindPong {
		return frame{}, fmt.Errorf("%w: kind %d", errBadFrame, f.kind)
	}
	if (f.kind == kindCancel || f.kind == kindPing || f.kind == kindPong) && n != 0 {
		return frame{}, fmt.Errorf("%w: kind %d with a %d-byte body", errBadFrame, f.kind, n)
	}
	if rd.onHeader != nil {
		rd.onHeader(rd.r.Buffered() >= int(n))
	}
	if n == 0 {
		return f, nil
	}
	// The body grows as its bytes arrive: a header alone must not make
	// the reader allocate (or reserve) what it declares.
	fail := func(err error) (frame, error) {
		if rd.release != nil && f.held > 0 {
			rd.release(f.held)
		}
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return frame{}, err
	}
	for len(f.body) < int(n) {
		if len(f.body) == cap(f.body) {
			// Grow only once more bytes are here.
			if _, err := rd.r.Peek(1); err != nil {
				return fail(err)
			}
			c := min(int(n), max(2*cap(f.body), growStep))
			if rd.reserve != nil {
				if err := rd.reserve(c - cap(f.body)); err != nil {
					return fail(err)
				}
				f.held += c - cap(f.body)
			}
			nb := make([]byte, len(f.body), c)
			copy(nb, f.body)
			f.body = nb
		}
		m, err := rd.r.Read(f.body[len(f.body):cap(f.body)])
		f.body = f.body[:len(f.body)+m]
		if err != nil && len(f.body) < int(n) {
			return fail(err)
		}
	}
	return f, nil
}

// parseRequest splits a request body into timeout (0: none), method and
// message; method and message alias body.
func parseRequest(body []byte) (time.Duration, []byte, []byte, error) {
	if len(body) < requestFixed {
		return 0, nil, nil, fmt.Errorf("%w: short request", errBadFrame)
	}
	us := binary.LittleEndian.Uint64(body[0:8])
	n := int(body[8])
	if n == 0 || len(body) < requestFixed+n {
		return 0, nil, nil, fmt.Errorf("%w: bad method name", errBadFrame)
	}
	var d time.Duration
	if us > 0 {
		d = time.Duration(min(us, uint64(maxTimeout/time.Microsecond))) * time.Microsecond
	}
	return d, body[requestFixed : requestFixed+n], body[requestFixed+n:], nil
}

// maxTimeout caps a received timeout (so it cannot overflow a deadline).
const maxTimeout = 100 * 365 * 24 * time.Hour

// putHeader fills buf[:headerLen] for a frame whose body is the rest of
// buf.
func putHeader(buf []byte, id uint32, kind byte, max int) error {
	n := len(buf) - headerLen
	if n > max {
		return fmt.Errorf("crpc: %d-byte message > %d", n, max)
	}
	binary.LittleEndian.PutUint32(buf[0:4], uint32(n))
	binary.LittleEndian.PutUint32(buf[4:8], id)
	buf[8] = kind
	return nil
}

// control is a frame without a body (cancel, ping, pong).
func control(id uint32, kind byte) []byte {
	b := make([]byte, headerLen)
	putHeader(b, id, kind, 0)
	return b
}
