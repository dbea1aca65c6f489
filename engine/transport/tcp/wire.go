package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Wire constants of the reference's TCP data framing.
const (
	HeaderSize = 24

	OpRead  = 0
	OpWrite = 1
	// V2Flag in the opcode asks for acknowledged framing.
	V2Flag = 0x80

	StatusMagic    uint64 = 0x4D435456 << 32 // "MCTV"
	StatusOK              = StatusMagic | 0
	StatusRejected        = StatusMagic | 1
	StatusSize            = 8
)

// Header is a request header: size and addr little-endian, then the
// opcode byte and 7 bytes of padding.
type Header struct {
	Size   uint64
	Addr   uint64
	Opcode uint8
}

// Put encodes h into b[:HeaderSize].
func (h Header) Put(b []byte) {
	_ = b[HeaderSize-1]
	binary.LittleEndian.PutUint64(b[0:], h.Size)
	binary.LittleEndian.PutUint64(b[8:], h.Addr)
	b[16] = h.Opcode
	clear(b[17:HeaderSize])
}

// ErrBadHeader reports a header no request can have.
var ErrBadHeader = errors.New("tcp: malformed request header")

// ParseHeader decodes a header. It rejects a zero size or a range that
// wraps; whether the range is registered is the server's next check.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("%w: %d bytes", ErrBadHeader, len(b))
	}
	h := Header{
		Size:   binary.LittleEndian.Uint64(b[0:]),
		Addr:   binary.LittleEndian.Uint64(b[8:]),
		Opcode: b[16],
	}
	if h.Size == 0 || h.Addr+h.Size < h.Addr {
		return h, fmt.Errorf("%w: addr %#x size %d", ErrBadHeader, h.Addr, h.Size)
	}
	return h, nil
}

// IsWrite reports whether the opcode is a WRITE; the reference serves
// every other opcode as a READ.
func (h Header) IsWrite() bool { return h.Opcode&^V2Flag == OpWrite }

// V2 reports whether the request asks for status words.
func (h Header) V2() bool { return h.Opcode&V2Flag != 0 }

// ErrBadStatus reports a status word without the magic.
var ErrBadStatus = errors.New("tcp: malformed status word")

// ParseStatus checks a status word's magic and returns the word; the
// caller compares it with StatusOK.
func ParseStatus(b []byte) (uint64, error) {
	if len(b) < StatusSize {
		return 0, fmt.Errorf("%w: %d bytes", ErrBadStatus, len(b))
	}
	v := binary.LittleEndian.Uint64(b)
	if v&0xFFFFFFFF00000000 != StatusMagic {
		return v, fmt.Errorf("%w: %#016x", ErrBadStatus, v)
	}
	return v, nil
}
