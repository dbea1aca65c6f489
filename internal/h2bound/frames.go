package h2bound

import "encoding/binary"

// HTTP/2 framing (RFC 9113 §4.1): a 9-byte header (length, 24 bits; type;
// flags; stream id, 31 bits) and length bytes of payload; a client first
// sends the 24-byte preface.
const (
	frameData      = 0x0
	frameHeaders   = 0x1
	frameRSTStream = 0x3
	frameSettings  = 0x4
	flagEndStream  = 0x1
	flagAck        = 0x1 // SETTINGS, PING

	settingInitialWindowSize = 0x4
	initialWindow            = 65535 // both windows' size before SETTINGS (RFC 9113 §6.9.2)
)

const clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

const (
	evNone    = iota
	evHeader  // a frame header is complete (end: its payload is empty)
	evPayload // n payload bytes of the current frame (end: its last)
)

type event struct {
	kind  int
	typ   byte
	flags byte
	sid   uint32
	n     int
	end   bool
	// length is a header's payload length (evHeader).
	length int
}

// frames follows a byte stream's frame boundaries without holding its
// payload.
type frames struct {
	preface int // preface bytes still to skip
	hdr     [9]byte
	nhdr    int
	left    int // payload bytes left in the current frame
	typ     byte
	flags   byte
	sid     uint32
}

// step consumes a prefix of p (at least one byte) and says what it was.
func (f *frames) step(p []byte) (int, event) {
	if f.preface > 0 {
		n := min(f.preface, len(p))
		f.preface -= n
		return n, event{}
	}
	if f.left > 0 {
		n := min(f.left, len(p))
		f.left -= n
		return n, event{kind: evPayload, typ: f.typ, flags: f.flags, sid: f.sid, n: n, end: f.left == 0}
	}
	n := copy(f.hdr[f.nhdr:], p)
	f.nhdr += n
	if f.nhdr < len(f.hdr) {
		return n, event{}
	}
	f.nhdr = 0
	f.left, f.typ, f.flags, f.sid = header(f.hdr[:])
	return n, event{kind: evHeader, typ: f.typ, flags: f.flags, sid: f.sid, end: f.left == 0, length: f.left}
}

// header decodes a 9-byte frame header.
func header(h []byte) (length int, typ, flags byte, sid uint32) {
	return int(h[0])<<16 | int(h[1])<<8 | int(h[2]), h[3], h[4], binary.BigEndian.Uint32(h[5:9]) & 0x7fffffff
}

// boundary reports whether the stream is between frames.
func (f *frames) boundary() bool { return f.preface == 0 && f.left == 0 && f.nhdr == 0 }
