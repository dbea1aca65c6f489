package tcp_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/crescent-kv/crescent/engine/transport/tcp"
)

// The golden bytes below are written from the reference's layout
// (SessionHeader {u64 size, u64 addr, u8 opcode} + 7 padding bytes, all
// little-endian; status = "MCTV" << 32 | code, little-endian), not from
// the encoder under test.

func TestHeaderPutGolden(t *testing.T) {
	cases := []struct {
		name string
		h    tcp.Header
		want []byte
	}{
		{
			name: "v2 write",
			h:    tcp.Header{Size: 0x0102030405060708, Addr: 0x1112131415161718, Opcode: tcp.OpWrite | tcp.V2Flag},
			want: []byte{
				0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,
				0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,
				0x81, 0, 0, 0, 0, 0, 0, 0,
			},
		},
		{
			name: "v1 read of 64 KiB at 0x7f0000000000",
			h:    tcp.Header{Size: 65536, Addr: 0x7f0000000000, Opcode: tcp.OpRead},
			want: []byte{
				0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
				0x00, 0x00, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00,
				0x00, 0, 0, 0, 0, 0, 0, 0,
			},
		},
		{
			name: "v2 read",
			h:    tcp.Header{Size: 1, Addr: 1, Opcode: tcp.OpRead | tcp.V2Flag},
			want: []byte{1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A dirty buffer: Put must clear the padding.
			b := bytes.Repeat([]byte{0xee}, tcp.HeaderSize+4)
			tc.h.Put(b)
			if !bytes.Equal(b[:tcp.HeaderSize], tc.want) {
				t.Fatalf("Put = % x\nwant  % x", b[:tcp.HeaderSize], tc.want)
			}
			if !bytes.Equal(b[tcp.HeaderSize:], []byte{0xee, 0xee, 0xee, 0xee}) {
				t.Fatalf("Put wrote past the header")
			}
			h, err := tcp.ParseHeader(tc.want)
			if err != nil || h != tc.h {
				t.Fatalf("ParseHeader = %+v, %v", h, err)
			}
		})
	}
}

func TestWireConstants(t *testing.T) {
	if tcp.HeaderSize != 24 || tcp.StatusSize != 8 || tcp.OpRead != 0 || tcp.OpWrite != 1 || tcp.V2Flag != 0x80 {
		t.Fatal("wire constants differ from the reference")
	}
}

func TestStatusWordsGolden(t *testing.T) {
	cases := []struct {
		name string
		v    uint64
		want []byte
	}{
		{"ok", tcp.StatusOK, []byte{0x00, 0x00, 0x00, 0x00, 0x56, 0x54, 0x43, 0x4D}},
		{"rejected", tcp.StatusRejected, []byte{0x01, 0x00, 0x00, 0x00, 0x56, 0x54, 0x43, 0x4D}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := binary.LittleEndian.AppendUint64(nil, tc.v); !bytes.Equal(got, tc.want) {
				t.Fatalf("status %#x on the wire = % x, want % x", tc.v, got, tc.want)
			}
			// "MCTV" reads backwards in the top four bytes.
			if string(tc.want[4:]) != "VTCM" {
				t.Fatalf("magic bytes %q", tc.want[4:])
			}
			v, err := tcp.ParseStatus(tc.want)
			if err != nil || v != tc.v {
				t.Fatalf("ParseStatus = %#x, %v", v, err)
			}
		})
	}
}

func TestParseStatus(t *testing.T) {
	cases := []struct {
		name string
		in   []byte
		want uint64
		bad  bool
	}{
		{"ok", []byte{0, 0, 0, 0, 0x56, 0x54, 0x43, 0x4D}, tcp.StatusOK, false},
		{"rejected", []byte{1, 0, 0, 0, 0x56, 0x54, 0x43, 0x4D}, tcp.StatusRejected, false},
		// A future code with the magic is a valid frame; the caller
		// decides it is not OK.
		{"other code", []byte{7, 0, 0, 0, 0x56, 0x54, 0x43, 0x4D}, tcp.StatusMagic | 7, false},
		{"zero", make([]byte, 8), 0, true},
		{"big-endian ok", []byte{0x4D, 0x43, 0x54, 0x56, 0, 0, 0, 0}, 0, true},
		{"READ data instead of a status", []byte("hello wo"), 0, true},
		{"magic off by one", []byte{0, 0, 0, 0, 0x57, 0x54, 0x43, 0x4D}, 0, true},
		{"short", []byte{0, 0, 0, 0, 0x56, 0x54, 0x43}, 0, true},
		{"empty", nil, 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := tcp.ParseStatus(tc.in)
			if tc.bad {
				if !errors.Is(err, tcp.ErrBadStatus) {
					t.Fatalf("ParseStatus(% x) = %#x, %v; want ErrBadStatus", tc.in, v, err)
				}
				return
			}
			if err != nil || v != tc.want {
				t.Fatalf("ParseStatus(% x) = %#x, %v; want %#x", tc.in, v, err, tc.want)
			}
		})
	}
}

func TestParseHeader(t *testing.T) {
	hdr := func(size, addr uint64, op byte, pad byte) []byte {
		b := binary.LittleEndian.AppendUint64(nil, size)
		b = binary.LittleEndian.AppendUint64(b, addr)
		b = append(b, op)
		return append(b, bytes.Repeat([]byte{pad}, 7)...)
	}
	cases := []struct {
		name    string
		in      []byte
		want    tcp.Header
		bad     bool
		write   bool
		v2      bool
		readNow bool
	}{
		{name: "v1 read", in: hdr(10, 4096, 0, 0), want: tcp.Header{Size: 10, Addr: 4096, Opcode: 0}},
		{name: "v1 write", in: hdr(10, 4096, 1, 0), want: tcp.Header{Size: 10, Addr: 4096, Opcode: 1}, write: true},
		{name: "v2 read", in: hdr(10, 4096, 0x80, 0), want: tcp.Header{Size: 10, Addr: 4096, Opcode: 0x80}, v2: true},
		{name: "v2 write", in: hdr(10, 4096, 0x81, 0), want: tcp.Header{Size: 10, Addr: 4096, Opcode: 0x81}, write: true, v2: true},
		// The reference does not zero the padding and ignores it.
		{name: "garbage padding", in: hdr(10, 4096, 0x81, 0xcc), want: tcp.Header{Size: 10, Addr: 4096, Opcode: 0x81}, write: true, v2: true},
		// Anything that is not WRITE is served as READ.
		{name: "opcode 2 is a read", in: hdr(1, 1, 2, 0), want: tcp.Header{Size: 1, Addr: 1, Opcode: 2}},
		{name: "opcode 0x83 is a v2 read", in: hdr(1, 1, 0x83, 0), want: tcp.Header{Size: 1, Addr: 1, Opcode: 0x83}, v2: true},
		{name: "opcode 0xff is a v2 read", in: hdr(1, 1, 0xff, 0), want: tcp.Header{Size: 1, Addr: 1, Opcode: 0xff}, v2: true},
		{name: "longer input", in: append(hdr(5, 8, 1, 0), 1, 2, 3), want: tcp.Header{Size: 5, Addr: 8, Opcode: 1}, write: true},
		{name: "ends at the top of the address space", in: hdr(1, ^uint64(0)-1, 0, 0), want: tcp.Header{Size: 1, Addr: ^uint64(0) - 1}},
		{name: "zero size", in: hdr(0, 4096, 1, 0), bad: true},
		{name: "wraps", in: hdr(2, ^uint64(0), 0, 0), bad: true},
		{name: "wraps by a lot", in: hdr(1<<63, 1<<63, 0x81, 0), bad: true},
		{name: "short", in: hdr(1, 1, 0, 0)[:23], bad: true},
		{name: "empty", in: nil, bad: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, err := tcp.ParseHeader(tc.in)
			if tc.bad {
				if !errors.Is(err, tcp.ErrBadHeader) {
					t.Fatalf("ParseHeader = %+v, %v; want ErrBadHeader", h, err)
				}
				return
			}
			if err != nil || h != tc.want {
				t.Fatalf("ParseHeader = %+v, %v; want %+v", h, err, tc.want)
			}
			if h.IsWrite() != tc.write || h.V2() != tc.v2 {
				t.Fatalf("IsWrite=%v V2=%v, want %v %v", h.IsWrite(), h.V2(), tc.write, tc.v2)
			}
		})
	}
}

func BenchmarkHeaderPutParse(b *testing.B) {
	var buf [tcp.HeaderSize]byte
	h := tcp.Header{Size: 1 << 20, Addr: 0x7f0000000000, Opcode: tcp.OpWrite | tcp.V2Flag}
	b.SetBytes(tcp.HeaderSize)
	b.ReportAllocs()
	for b.Loop() {
		h.Put(buf[:])
		if _, err := tcp.ParseHeader(buf[:]); err != nil {
			b.Fatal(err)
		}
	}
}

func FuzzParseHeader(f *testing.F) {
	for _, h := range []tcp.Header{
		{Size: 1, Addr: 1, Opcode: 0},
		{Size: 1 << 20, Addr: 0x7f0000000000, Opcode: 0x81},
		{Size: 1, Addr: ^uint64(0) - 1, Opcode: 0x80},
		{Size: 2, Addr: ^uint64(0), Opcode: 1},
		{Size: 0, Addr: 4096, Opcode: 1},
	} {
		var b [tcp.HeaderSize]byte
		h.Put(b[:])
		f.Add(b[:])
	}
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{0xff}, 30))
	f.Fuzz(func(t *testing.T, in []byte) {
		h, err := tcp.ParseHeader(in)
		if err != nil {
			if !errors.Is(err, tcp.ErrBadHeader) {
				t.Fatalf("error %v is not ErrBadHeader", err)
			}
			return
		}
		if len(in) < tcp.HeaderSize || h.Size == 0 || h.Addr+h.Size < h.Addr {
			t.Fatalf("accepted %+v from %d bytes", h, len(in))
		}
		if h.Size != binary.LittleEndian.Uint64(in) || h.Addr != binary.LittleEndian.Uint64(in[8:]) || h.Opcode != in[16] {
			t.Fatalf("decoded %+v from % x", h, in[:tcp.HeaderSize])
		}
		if h.IsWrite() != (in[16]&0x7f == 1) || h.V2() != (in[16]&0x80 != 0) {
			t.Fatalf("opcode %#x: IsWrite=%v V2=%v", in[16], h.IsWrite(), h.V2())
		}
		// Re-encoding keeps the meaningful 17 bytes and zeroes the padding.
		var out [tcp.HeaderSize]byte
		h.Put(out[:])
		if !bytes.Equal(out[:17], in[:17]) || !bytes.Equal(out[17:], make([]byte, 7)) {
			t.Fatalf("re-encoded % x from % x", out, in[:tcp.HeaderSize])
		}
	})
}

func FuzzParseStatus(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0x56, 0x54, 0x43, 0x4D})
	f.Add([]byte{1, 0, 0, 0, 0x56, 0x54, 0x43, 0x4D})
	f.Add([]byte{0, 0, 0, 0, 0x56, 0x54, 0x43})
	f.Add([]byte("MCTV\x00\x00\x00\x00"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		v, err := tcp.ParseStatus(in)
		valid := len(in) >= tcp.StatusSize && binary.LittleEndian.Uint64(in)>>32 == 0x4D435456
		if valid != (err == nil) {
			t.Fatalf("ParseStatus(% x) = %#x, %v", in, v, err)
		}
		if err != nil && !errors.Is(err, tcp.ErrBadStatus) {
			t.Fatalf("error %v is not ErrBadStatus", err)
		}
		if err == nil && (v != binary.LittleEndian.Uint64(in) || (v == tcp.StatusOK) != bytes.Equal(in[:8], []byte{0, 0, 0, 0, 0x56, 0x54, 0x43, 0x4D})) {
			t.Fatalf("ParseStatus(% x) = %#x", in, v)
		}
	})
}
