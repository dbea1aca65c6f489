package metadata

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
)

// frameBytes builds a typed frame by hand (u64 LE length = 1 + len(body),
// type byte, body), independently of WriteFrame.
func frameBytes(t MsgType, body string) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(1+len(body)))
	b = append(b, byte(t))
	return append(b, body...)
}

func TestWriteFrameGolden(t *testing.T) {
	cases := []struct {
		name string
		t    MsgType
		body string
		want []byte
	}{
		{
			// 18 bytes of JSON + 1 type byte = 19 = 0x13.
			name: "metadata name=segment",
			t:    Metadata,
			body: `{"name":"segment"}`,
			want: append([]byte{0x13, 0, 0, 0, 0, 0, 0, 0, 0x01}, `{"name":"segment"}`...),
		},
		{
			name: "probe with FastWriter newline",
			t:    Probe,
			body: "{}\n",
			want: []byte{0x04, 0, 0, 0, 0, 0, 0, 0, 0x03, '{', '}', '\n'},
		},
		{
			name: "notify",
			t:    Notify,
			body: `{"name":"","notify_msg":"success"}` + "\n",
			want: append([]byte{0x24, 0, 0, 0, 0, 0, 0, 0, 0x02}, `{"name":"","notify_msg":"success"}`+"\n"...),
		},
		{
			name: "connection, empty body",
			t:    Connection,
			body: "",
			want: []byte{0x01, 0, 0, 0, 0, 0, 0, 0, 0x00},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteFrame(&buf, tc.t, []byte(tc.body)); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), tc.want) {
				t.Fatalf("WriteFrame = % x\nwant        % x", buf.Bytes(), tc.want)
			}
			if !bytes.Equal(frameBytes(tc.t, tc.body), tc.want) {
				t.Fatalf("test helper disagrees with golden bytes")
			}
		})
	}
}

func TestFrameRoundTrip(t *testing.T) {
	big := strings.Repeat("x", DefaultMaxFrame-1) // length field exactly the maximum
	cases := []struct {
		name string
		t    MsgType
		body string
	}{
		{"connection", Connection, `{"local_nic_path":"a@mlx5_0","qp_num":[1,2]}` + "\n"},
		{"metadata", Metadata, `{"name":"127.0.0.1:15001","protocol":"tcp"}` + "\n"},
		{"notify", Notify, `{"name":"a","notify_msg":"hello"}`},
		{"probe", Probe, "{}"},
		{"empty body", Probe, ""},
		{"binary body", Metadata, "\x00\xff\n\r"},
		{"at the bound", Metadata, big},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteFrame(&buf, tc.t, []byte(tc.body)); err != nil {
				t.Fatal(err)
			}
			// Two frames back to back: ReadFrame must consume exactly one.
			WriteFrame(&buf, Probe, []byte("{}"))
			gt, body, err := ReadFrame(&buf, DefaultMaxFrame)
			if err != nil {
				t.Fatal(err)
			}
			if gt != tc.t || string(body) != tc.body {
				t.Fatalf("got (%v, %d bytes), want (%v, %d bytes)", gt, len(body), tc.t, len(tc.body))
			}
			gt, body, err = ReadFrame(&buf, DefaultMaxFrame)
			if err != nil || gt != Probe || string(body) != "{}" {
				t.Fatalf("second frame: %v %q %v", gt, body, err)
			}
			if buf.Len() != 0 {
				t.Fatalf("%d bytes left over", buf.Len())
			}
		})
	}
}

func TestReadFrameErrors(t *testing.T) {
	le := func(n uint64) []byte { return binary.LittleEndian.AppendUint64(nil, n) }
	cases := []struct {
		name string
		in   []byte
		max  int
		want error
	}{
		{"no bytes", nil, 64, io.EOF},
		{"short length", []byte{1, 0, 0}, 64, io.ErrUnexpectedEOF},
		{"zero length", le(0), 64, ErrFrameEmpty},
		{"one past the bound", le(65), 64, ErrFrameTooLarge},
		{"default bound + 1", le(DefaultMaxFrame + 1), DefaultMaxFrame, ErrFrameTooLarge},
		{"huge length", le(1 << 63), DefaultMaxFrame, ErrFrameTooLarge},
		{"all ones", le(^uint64(0)), DefaultMaxFrame, ErrFrameTooLarge},
		// An HTTP request read as a frame: "GET / HT" is a huge length.
		{"http probe", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), DefaultMaxFrame, ErrFrameTooLarge},
		// A TLS ClientHello prefix: 16 03 01 ... is a length of ~2^40+.
		{"tls hello", []byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03}, DefaultMaxFrame, ErrFrameTooLarge},
		{"truncated body", append(le(10), 1, '{'), 64, io.ErrUnexpectedEOF},
		{"length but no body", le(5), 64, io.ErrUnexpectedEOF},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ReadFrame(bytes.NewReader(tc.in), tc.max)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

// TestReadFrameAllocBound checks that a length field cannot make the
// reader allocate more than the bound, whatever it claims.
func TestReadFrameAllocBound(t *testing.T) {
	const max = 64 << 10
	for _, n := range []uint64{max + 1, 1 << 30, 1 << 62, ^uint64(0)} {
		in := binary.LittleEndian.AppendUint64(nil, n)
		got := allocated(func() { ReadFrame(bytes.NewReader(in), max) })
		if got > 16<<10 {
			t.Errorf("length %d: allocated %d bytes for a refused frame", n, got)
		}
	}
	// A frame at the bound allocates about the bound, no more.
	in := binary.LittleEndian.AppendUint64(nil, max)
	in = append(in, make([]byte, max)...)
	if got := allocated(func() { ReadFrame(bytes.NewReader(in), max) }); got > 2*max {
		t.Errorf("frame of %d bytes: allocated %d", max, got)
	}
}

// allocated reports the bytes f allocated on the heap.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestMsgTypeString(t *testing.T) {
	for tp, want := range map[MsgType]string{Connection: "Connection", Metadata: "Metadata", Notify: "Notify", Probe: "Probe", 9: "MsgType(9)"} {
		if got := tp.String(); got != want {
			t.Errorf("%d: %q, want %q", uint8(tp), got, want)
		}
	}
}

// errWriter fails every write.
type errWriter struct{}

func (errWriter) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }

func TestWriteFrameError(t *testing.T) {
	if err := WriteFrame(errWriter{}, Probe, []byte("{}")); !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("err = %v", err)
	}
}

func FuzzReadFrame(f *testing.F) {
	f.Add(frameBytes(Metadata, `{"name":"segment"}`))
	f.Add(frameBytes(Probe, "{}\n"))
	f.Add(frameBytes(Notify, `{"name":"a","notify_msg":"b"}`))
	f.Add(frameBytes(Connection, ""))
	f.Add(binary.LittleEndian.AppendUint64(nil, 0))
	f.Add(binary.LittleEndian.AppendUint64(nil, 1<<40))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add(append(binary.LittleEndian.AppendUint64(nil, 8), `{"a":1}`...))
	f.Add([]byte{})
	const max = 4096
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		var (
			tp   MsgType
			body []byte
			err  error
		)
		alloc := allocated(func() { tp, body, err = ReadFrame(r, max) })
		if alloc > max+8<<10 {
			t.Fatalf("allocated %d bytes with a bound of %d", alloc, max)
		}
		if err != nil {
			if body != nil {
				t.Fatalf("body returned with error %v", err)
			}
			return
		}
		n := binary.LittleEndian.Uint64(in)
		if n == 0 || n > max || uint64(len(body))+1 != n {
			t.Fatalf("length field %d accepted with body of %d bytes", n, len(body))
		}
		if byte(tp) != in[8] || !bytes.Equal(body, in[9:8+n]) {
			t.Fatalf("frame decoded wrongly")
		}
		if r.Len() != len(in)-8-int(n) {
			t.Fatalf("consumed %d bytes, want %d", len(in)-r.Len(), 8+n)
		}
		// Re-encoding gives the same bytes.
		var buf bytes.Buffer
		WriteFrame(&buf, tp, body)
		if !bytes.Equal(buf.Bytes(), in[:8+n]) {
			t.Fatalf("re-encoded frame differs")
		}
	})
}
