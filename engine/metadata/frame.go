package metadata

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
)

// MsgType is the type byte of a handshake frame.
type MsgType uint8

// Handshake message types, as the reference numbers them.
const (
	Connection MsgType = 0
	Metadata   MsgType = 1
	Notify     MsgType = 2
	Probe      MsgType = 3
)

func (t MsgType) String() string {
	switch t {
	case Connection:
		return "Connection"
	case Metadata:
		return "Metadata"
	case Notify:
		return "Notify"
	case Probe:
		return "Probe"
	}
	return fmt.Sprintf("MsgType(%d)", uint8(t))
}

// frameChunk is the first allocation for a frame's bytes.
const frameChunk = 64 << 10

// DefaultMaxFrame bounds a frame's length field (type byte + JSON).
const DefaultMaxFrame = 1 << 20

var (
	ErrFrameTooLarge = errors.New("metadata: handshake frame too large")
	ErrFrameEmpty    = errors.New("metadata: handshake frame has no type byte")
	ErrUnknownType   = errors.New("metadata: unknown handshake message type")
)

// WriteFrame writes one frame: u64 little-endian length (1 + len(body)),
// the type byte, then body.
func WriteFrame(w io.Writer, t MsgType, body []byte) error {
	buf := make([]byte, 9+len(body))
	binary.LittleEndian.PutUint64(buf, uint64(1+len(body)))
	buf[8] = byte(t)
	copy(buf[9:], body)
	_, err := w.Write(buf)
	return err
}

// ReadFrame reads one frame whose length field is at most max.
func ReadFrame(r io.Reader, max int) (MsgType, []byte, error) {
	var hdr [8]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint64(hdr[:])
	if n == 0 {
		return 0, nil, ErrFrameEmpty
	}
	if n > uint64(max) {
		return 0, nil, fmt.Errorf("%w: %d bytes > %d", ErrFrameTooLarge, n, max)
	}
	// Grow as bytes arrive: a length field alone must not cost max bytes
	// (the server holds many connections).
	buf := make([]byte, 0, min(n, frameChunk))
	for uint64(len(buf)) < n {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, int(min(n, 2*uint64(cap(buf))))-len(buf))
		}
		k, err := io.ReadFull(r, buf[len(buf):min(uint64(cap(buf)), n)])
		buf = buf[:len(buf)+k]
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return 0, nil, err
		}
	}
	return MsgType(buf[0]), buf[1:], nil
}
