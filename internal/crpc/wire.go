package crpc

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

const (
	magic      = "CRPC"
	version    = 1
	prefaceLen = 8
	headerLen  = 9

	// MaxFrame bounds a frame's body, as gRPC's message size limits do.
	MaxFrame = 256 << 20

	kindRequest = 1
	kindReply   = 2
	kindError   = 3
)

// ErrNotCRPC is returned by Dial when the server answers with something
// other than a crpc preface (a gRPC-only server, say).
var ErrNotCRPC = errors.New("crpc: the server does not speak crpc")

// errBadFrame reports a frame that breaks the format.
var errBadFrame = errors.New("crpc: malformed frame")

func preface() []byte {
	p := make([]byte, prefaceLen)
	copy(p, magic)
	p[4] = version
	return p
}

// checkPreface validates a peer's preface.
func checkPreface(p []byte) error {
	if string(p[:4]) != magic {
		return ErrNotCRPC
	}
	if p[4] != version {
		return fmt.Errorf("crpc: version %d, this side speaks %d", p[4], version)
	}
	return nil
}

// frame is one decoded frame; body aliases the reader's buffer only
// until the next read.
type frame struct {
	id   uint32
	kind byte
	body []byte
}

// reader decodes frames.
type reader struct {
	r   *bufio.Reader
	hdr [headerLen]byte
}

func newReader(r io.Reader) *reader { return &reader{r: bufio.NewReaderSize(r, 64<<10)} }

// next reads one frame; its body is a fresh slice (handlers keep it).
func (rd *reader) next() (frame, error) {
	if _, err := io.ReadFull(rd.r, rd.hdr[:]); err != nil {
		return frame{}, err
	}
	n := binary.LittleEndian.Uint32(rd.hdr[0:4])
	f := frame{id: binary.LittleEndian.Uint32(rd.hdr[4:8]), kind: rd.hdr[8]}
	if n > MaxFrame {
		return frame{}, fmt.Errorf("%w: %d-byte body > %d", errBadFrame, n, MaxFrame)
	}
	if f.kind < kindRequest || f.kind > kindError {
		return frame{}, fmt.Errorf("%w: kind %d", errBadFrame, f.kind)
	}
	if n <= 1<<20 {
		f.body = make([]byte, n)
		if _, err := io.ReadFull(rd.r, f.body); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return frame{}, err
		}
		return f, nil
	}
	// A large body grows as its bytes arrive: a header alone must not
	// make the reader allocate MaxFrame.
	var b bytes.Buffer
	if _, err := io.CopyN(&b, rd.r, int64(n)); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return frame{}, err
	}
	f.body = b.Bytes()
	return f, nil
}

// parseRequest splits a request body into method and message.
func parseRequest(body []byte) (string, []byte, error) {
	if len(body) < 1 || int(body[0]) == 0 || len(body) < 1+int(body[0]) {
		return "", nil, fmt.Errorf("%w: bad method name", errBadFrame)
	}
	n := int(body[0])
	return string(body[1 : 1+n]), body[1+n:], nil
}

// putHeader fills buf[:headerLen] for a frame whose body is the rest of
// buf.
func putHeader(buf []byte, id uint32, kind byte) error {
	n := len(buf) - headerLen
	if n > MaxFrame {
		return fmt.Errorf("crpc: %d-byte message > %d", n, MaxFrame)
	}
	binary.LittleEndian.PutUint32(buf[0:4], uint32(n))
	binary.LittleEndian.PutUint32(buf[4:8], id)
	buf[8] = kind
	return nil
}
