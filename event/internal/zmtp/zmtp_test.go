package zmtp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func reader(b []byte) *Conn { return &Conn{br: bufio.NewReader(bytes.NewReader(b))} }

func TestReadMsg(t *testing.T) {
	long := bytes.Repeat([]byte{7}, 300)
	var in []byte
	in = append(in, 0x04, 5, 4, 'P', 'I', 'N', 'G') // a command: skipped
	in = AppendMsg(in, []byte("topic"), []byte{}, long)
	in = AppendMsg(in, []byte("x"))
	c := reader(in)
	msg, err := c.ReadMsg()
	if err != nil {
		t.Fatal(err)
	}
	if len(msg) != 3 || string(msg[0]) != "topic" || len(msg[1]) != 0 || !bytes.Equal(msg[2], long) {
		t.Fatalf("got %q", msg)
	}
	if msg, err = c.ReadMsg(); err != nil || len(msg) != 1 || string(msg[0]) != "x" {
		t.Fatalf("got %q, %v", msg, err)
	}
	if _, err = c.ReadMsg(); err != io.EOF {
		t.Fatalf("at end: %v", err)
	}
	// The long-frame header of AppendMsg is the ZMTP one: flag 0x02, 8-byte size.
	if h := AppendHeader(nil, 300, true); !bytes.Equal(h, []byte{0x03, 0, 0, 0, 0, 0, 0, 1, 44}) {
		t.Fatalf("header %x", h)
	}
}

func TestReadMsgErrors(t *testing.T) {
	for name, in := range map[string][]byte{
		"truncated body":   {0x00, 5, 'a'},
		"truncated size":   {0x02, 0, 0},
		"more then EOF":    {0x01, 1, 'a'},
		"oversized frame":  {0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		"just over limit":  {0x02, 0, 0, 0, 0, 0x10, 0, 0, 1},
		"flag without len": {0x00},
	} {
		_, err := reader(in).ReadMsg()
		if err == nil || err == io.EOF {
			t.Errorf("%s: err = %v", name, err)
		}
		if name == "oversized frame" && !errors.Is(err, ErrLimit) {
			t.Errorf("%s: %v, want ErrLimit", name, err)
		}
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]Endpoint{
		"tcp://*:5557":         {Raw: "tcp://*:5557", Scheme: "tcp", Network: "tcp", Addr: ":5557"},
		"tcp://[::]:1":         {Raw: "tcp://[::]:1", Scheme: "tcp", Network: "tcp", Addr: "[::]:1"},
		"tcp://127.0.0.1:0":    {Raw: "tcp://127.0.0.1:0", Scheme: "tcp", Network: "tcp", Addr: "127.0.0.1:0"},
		"ipc:///run/kv.sock":   {Raw: "ipc:///run/kv.sock", Scheme: "ipc", Network: "unix", Addr: "/run/kv.sock"},
		"tcp://indexer.ns:555": {Raw: "tcp://indexer.ns:555", Scheme: "tcp", Network: "tcp", Addr: "indexer.ns:555"},
	} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %+v, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "tcp://", "tcp://host", "inproc://a", "pgm://x:1", "ipc://"} {
		if _, err := Parse(in); !errors.Is(err, ErrEndpoint) {
			t.Errorf("Parse(%q) = %v", in, err)
		}
	}
}

// countingReader counts the bytes the reader took from the peer.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func longHeader(flag byte, n uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{flag | flagLong}, n)
}

// A 9-byte header announcing 256 MiB must not allocate 256 MiB: the
// buffer grows with the bytes that actually arrive.
func TestHugeHeaderAllocatesWhatArrives(t *testing.T) {
	big := Limits{MaxMessage: 1 << 30}
	for _, tc := range []struct {
		name string
		body int
		max  uint64
	}{
		{"header then nothing", 0, 1 << 20},
		// Doubling from 4 KiB allocates about 4x what arrived in all
		// (every step counts in TotalAlloc), not the 256 MiB announced.
		{"header then 1 MiB", 1 << 20, 6 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append(longHeader(0, 256<<20), make([]byte, tc.body)...)
			c := reader(in)
			c.SetLimits(big)
			var err error
			n := testutil.Allocated(func() { _, err = c.ReadMsg() })
			require.ErrorIs(t, err, io.ErrUnexpectedEOF)
			assert.Less(t, n, tc.max, "allocated %d bytes for %d sent", n, len(in))
		})
	}
	// With the default limits the header alone is refused.
	c := reader(longHeader(0, 256<<20))
	var err error
	n := testutil.Allocated(func() { _, err = c.ReadMsg() })
	require.ErrorIs(t, err, ErrLimit)
	assert.Contains(t, err.Error(), "more than 67108864 bytes")
	assert.Less(t, n, uint64(64<<10))
}

func TestMessageSizeSumsFrames(t *testing.T) {
	in := AppendMsg(nil, make([]byte, 600), make([]byte, 600))
	c := reader(in)
	c.SetLimits(Limits{MaxMessage: 1000})
	_, err := c.ReadMsg()
	require.ErrorIs(t, err, ErrLimit)
	c = reader(in)
	c.SetLimits(Limits{MaxMessage: 1200})
	msg, err := c.ReadMsg()
	require.NoError(t, err)
	assert.Len(t, msg, 2)
}

// 1e5 tiny MORE frames: refused at the frame cap, long before the end.
func TestFrameCap(t *testing.T) {
	var in []byte
	for range 100000 {
		in = append(in, flagMore, 1, 'x')
	}
	in = append(in, 0, 1, 'y')
	cr := &countingReader{r: bytes.NewReader(in)}
	c := &Conn{br: bufio.NewReader(cr)}
	var err error
	n := testutil.Allocated(func() { _, err = c.ReadMsg() })
	require.ErrorIs(t, err, ErrLimit)
	assert.Contains(t, err.Error(), fmt.Sprintf("more than %d frames", DefaultMaxFrames))
	assert.Less(t, cr.n, 64<<10, "read on past the cap")
	assert.Less(t, n, uint64(64<<10))

	c = reader(AppendMsg(nil, []byte("a"), []byte("b"), []byte("c")))
	c.SetLimits(Limits{MaxFrames: 2})
	_, err = c.ReadMsg()
	require.ErrorIs(t, err, ErrLimit)
}

func TestCommandBounds(t *testing.T) {
	_, err := reader(longHeader(flagCommand, MaxCommand+1)).ReadMsg()
	require.ErrorIs(t, err, ErrLimit)
	_, err = reader([]byte{flagMore, 1, 'a', flagCommand, 0}).ReadMsg()
	require.ErrorIs(t, err, ErrProtocol)
}

// greeting is a ZMTP 3.0 NULL-security greeting (rfc 23, 64 bytes).
func greeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:], "NULL")
	return g
}

// zmq4 allocates a handshake frame's declared size up front: a READY of
// 2^62 bytes used to panic the process (makeslice), one of 1 GiB to
// allocate it.
func TestHandshakeBounded(t *testing.T) {
	for _, size := range []uint64{1 << 62, 1 << 30, maxHandshake + 1} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		peer, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		raw, err := ln.Accept()
		require.NoError(t, err)
		ln.Close()
		go io.Copy(io.Discard, peer)
		_, err = peer.Write(append(greeting(), longHeader(flagCommand, size)...))
		require.NoError(t, err)
		var herr error
		n := testutil.Allocated(func() { _, herr = Handshake(raw, zmq4.Pub, true, 5*time.Second) })
		require.ErrorIs(t, herr, ErrLimit, "size %d", size)
		assert.Less(t, n, uint64(1<<20))
		raw.Close()
		peer.Close()
	}
}

func FuzzReadMsg(f *testing.F) {
	f.Add(AppendMsg(nil, []byte("t"), make([]byte, 8), bytes.Repeat([]byte{1}, 300)))
	f.Add([]byte{0x04, 1, 0, 0x00, 0})
	f.Add([]byte{0x02, 0xff, 0, 0, 0, 0, 0, 0, 0})
	f.Add(longHeader(0, 60<<20))
	f.Add(append(longHeader(flagMore, 1<<20), make([]byte, 300)...))
	f.Add(bytes.Repeat([]byte{flagMore, 0}, 1000))
	f.Fuzz(func(t *testing.T, in []byte) {
		cr := &countingReader{r: bytes.NewReader(in)}
		c := &Conn{br: bufio.NewReader(cr)}
		total := 0
		n := testutil.Allocated(func() {
			for range 64 {
				msg, err := c.ReadMsg()
				if err != nil {
					return
				}
				for _, fr := range msg {
					total += len(fr)
				}
			}
		})
		if total > len(in) {
			t.Fatalf("messages of %d bytes from %d input bytes", total, len(in))
		}
		// Memory follows the bytes sent, not the sizes announced.
		if limit := uint64(4*cr.n + 64<<10); n > limit {
			t.Fatalf("allocated %d bytes reading %d input bytes", n, cr.n)
		}
	})
}
